package kubelettest

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// stopTimeout is how long Stop waits after SIGTERM before it kills.
const stopTimeout = 30 * time.Second

// Process is a node's process (a kubelet, a node agent, a driver) started
// by StartProcess.
type Process struct {
	cmd    *exec.Cmd
	exited chan struct{}
	log    string
}

// StartProcess starts args with its working directory {dir}/wd (empty, of
// its own: see the package doc) and its output appended to
// {dir}/{name}.log. The process gets SIGKILL if the test's process dies,
// and is stopped (Stop) when t ends.
func StartProcess(t testing.TB, dir, name string, args []string) *Process {
	t.Helper()
	return StartProcessEnv(t, dir, name, nil, args)
}

// StartProcessEnv is StartProcess with env ("NAME=value") added to the
// test process's environment.
func StartProcessEnv(t testing.TB, dir, name string, env, args []string) *Process {
	t.Helper()
	wd := filepath.Join(dir, "wd")
	if err := ensureDir(wd); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, name+".log")
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = wd, log, log
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the %s: %v", name, err)
	}
	p := &Process{cmd: cmd, exited: make(chan struct{}), log: logPath}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() { _ = p.Stop() })
	return p
}

// Stop sends SIGTERM and waits for the process to exit, killing it after
// 30 seconds; it returns an error if it had to kill it.
func (p *Process) Stop() error {
	select {
	case <-p.exited:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return nil
	case <-time.After(stopTimeout):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("process %d (log %s) ignored SIGTERM for %v: killed", p.cmd.Process.Pid, p.log, stopTimeout)
	}
}

// Exited is closed once the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Pid is the process's ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Log is the path of the process's log file.
func (p *Process) Log() string { return p.log }

// WaitFor polls cond every 50 ms until it holds; it fails when the process
// exits or ctx ends first, naming what and the log.
func (p *Process) WaitFor(ctx context.Context, what string, cond func() bool) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-p.exited:
			return fmt.Errorf("waiting for %s: the process exited (log %s)", what, p.log)
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s (log %s): %w", what, p.log, ctx.Err())
		case <-tick.C:
		}
	}
	return nil
}

// RSS is the process's resident set size (VmRSS of /proc/{pid}/status) in
// bytes.
func (p *Process) RSS() (uint64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.Pid()))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", p.Pid())
}
