// Command fakesystemd stands in for systemd-run, systemctl and sudo for
// Kubernetes' node e2e suite (e2e_node.test v1.37.2) on a machine without
// systemd (PID 1 is not systemd, no D-Bus) or sudo, like this one. When
// systemd-run is on its PATH the suite runs the kubelet as a transient
// unit, and it stops and restarts the kubelet (for every configuration
// change) only through `sudo systemctl ...` on that unit; without systemd
// those specs fail. The node conformance runner links this command into
// the suite's PATH as systemd-run, systemctl and sudo; it dispatches on
// the name it runs by and implements, with processes only, what the suite
// uses (test/e2e_node/util.go, services/kubelet.go, services/server.go):
//
//	sudo CMD [ARGS...]   runs CMD: the run is already root
//	systemd-run --version   "systemd 252 (...)"
//	systemd-run [-p Delegate=...] [-p StandardOutput=|StandardError=file:|append:PATH]
//		--unit=NAME [--slice=S] [--remain-after-exit] CMD [ARGS...]
//	systemctl [list-units] [PATTERN...] [--state=S,...]
//	systemctl start|stop|restart|kill|reset-failed|is-active [--quiet] UNIT...
//
// (systemctl also takes --no-pager). Anything else is an error saying
// fakesystemd does not implement it.
//
// Units are JSON files in the directory $NODEVOL_UNITS_DIR names, with a
// lock file serializing the commands that change them. systemd-run
// records a unit, unescapes %% and $$ in its command, and starts its
// supervisor (this command, in a session of its own), which starts the
// command in a process group of its own (in /, with systemd-run's
// caller's environment, output to the files named: append: appends,
// file: writes from the start), records it, and later records how it
// ended; systemd-run returns once the command started, and the unit
// outlives its caller. A unit runs, or has exited (with
// --remain-after-exit, after exit 0 or death by SIGHUP, SIGINT, SIGTERM
// or SIGPIPE; without, it is unloaded), or has failed. kill sends the
// unit's process group SIGTERM; stop sends SIGTERM, SIGKILL 90 s later,
// waits for the main process, and unloads the unit unless it failed;
// restart stops and starts the recorded command again; start does so for
// a failed unit only. Exit codes: 5 for a unit not loaded, 3 when
// is-active finds none active, else 1 on errors.
//
// Unlike systemd: no cgroups (Delegate, --slice are ignored; a process
// leaving the group escapes), no journal (output not named goes where the
// other goes, or to NAME.log in the units directory), no expansion of
// other specifiers or variables, the caller's environment rather than a
// clean one, and reset-failed leaves a failed unit loaded (systemd would
// unload it, failing the suite's restart that follows). The container
// runtime's unit, which the suite stops and starts over D-Bus
// (stopContainerRuntime in util.go), is not supported, nor is journalctl.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// dirEnv names the variable that names the units directory.
const dirEnv = "NODEVOL_UNITS_DIR"

func main() {
	name := filepath.Base(os.Args[0])
	var err error
	switch name {
	case "sudo":
		err = sudo(os.Args[1:])
	case "systemd-run":
		err = systemdRun(os.Args[1:])
	case "systemctl":
		err = systemctl(os.Args[1:])
	case superviseName:
		err = supervise(os.Args[1:])
	default:
		err = fmt.Errorf("called as %s: fakesystemd runs as sudo, systemd-run or systemctl (links by those names)", name)
	}
	if err == nil {
		return
	}
	if msg := err.Error(); msg != "" {
		fmt.Fprintf(os.Stderr, "%s: %s\n", name, msg)
	}
	var code exitStatus
	switch {
	case errors.As(err, &code):
	case errors.As(err, new(errNotLoaded)):
		code = 5
	default:
		code = 1
	}
	os.Exit(int(code))
}

// exitStatus is an exit code that is the whole error.
type exitStatus int

func (exitStatus) Error() string { return "" }

// sudo runs its command in its place: the run is already root.
func sudo(args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return fmt.Errorf("fakesystemd implements only 'sudo COMMAND [ARGS...]', not %q", args)
	}
	path, err := exec.LookPath(args[0])
	if err != nil {
		return err
	}
	return syscall.Exec(path, args, os.Environ())
}
