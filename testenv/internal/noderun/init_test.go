package noderun

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodevol/nodevol/internal/roottest"
)

// initHelperEnv makes the test binary the process under test in
// TestRunAsInit.
const initHelperEnv = "NODEVOL_NODERUN_INIT_HELPER"

// TestMain lets the test binary play a run under its init: PID 1 of a PID
// namespace of its own, RunAsInit starts the binary again as the run,
// which leaves an orphan behind (a shell's background sleep, reparented to
// PID 1 when the shell exits) and waits until it is reaped, checks that
// /proc/1 is its init and exits 7; the init then returns 7.
func TestMain(m *testing.M) {
	if os.Getenv(initHelperEnv) == "" {
		os.Exit(m.Run())
	}
	if code, ok := RunAsInit(); ok {
		os.Exit(code)
	}
	if os.Getpid() == 1 {
		os.Exit(3) // the run itself must not be PID 1
	}
	out, err := exec.Command("sh", "-c", "sleep 0.05 >/dev/null 2>&1 & echo $!").Output()
	if err != nil {
		os.Exit(4)
	}
	// The orphan exits soon after the shell; until its new parent, the
	// init, reaps it, it stays in /proc as a zombie.
	orphan := "/proc/" + strings.TrimSpace(string(out))
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(orphan); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			os.Exit(6)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cmdline, err := os.ReadFile("/proc/1/cmdline")
	if err != nil || !strings.HasPrefix(string(cmdline), os.Args[0]) {
		os.Exit(5) // PID 1 is not this binary: not the run's init
	}
	os.Exit(7)
}

// TestRunAsInit runs the test binary as PID 1 of a PID namespace of its
// own (unshare, as Reexec does with pid) and checks that the run's exit
// code comes through its init, which reaped the orphan on the way.
func TestRunAsInit(t *testing.T) {
	roottest.Require(t)
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--mount-proc", "--", os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), initHelperEnv+"=1")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("the run under its init: %v, want exit code 7\n%s", err, out)
	}
	if got := exit.ExitCode(); got != 7 {
		t.Fatalf("the run under its init exited %s, want 7 (3: the run was PID 1; 4: no orphan; 5: /proc/1 not its init; 6: the orphan never reaped)\n%s", strconv.Itoa(got), out)
	}
}

// TestRunAsInitElsewhere: outside PID 1, RunAsInit does nothing.
func TestRunAsInitElsewhere(t *testing.T) {
	if code, ok := RunAsInit(); ok || code != 0 {
		t.Fatalf("RunAsInit in a test process: %d, %v; want 0, false", code, ok)
	}
}
