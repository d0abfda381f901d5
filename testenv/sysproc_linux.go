package testenv

import "syscall"

// sysProcAttr puts the child in a process group of its own and has the
// kernel kill it if the test process dies without calling Stop.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
