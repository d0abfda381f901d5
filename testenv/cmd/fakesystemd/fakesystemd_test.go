package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// binary is the command, built once by TestMain.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fakesystemd-test-")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "fakesystemd")
	out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// node is a PATH with fakesystemd linked as systemd-run, systemctl and
// sudo, a units directory and a unit script.
type node struct {
	t                   *testing.T
	path, units, script string
	pids                []int // every unit process seen, killed at the end
}

// script starts a child, reports both pids and its arguments on stderr,
// and something on stdout, then waits.
const script = `#!/bin/sh
sleep 60 &
echo "start $$ child $! args $*" >&2
echo "stdout $$"
wait
`

func newNode(t *testing.T) *node {
	dir := t.TempDir()
	n := &node{t: t, path: filepath.Join(dir, "bin"), units: filepath.Join(dir, "units"), script: filepath.Join(dir, "unit.sh")}
	if err := os.Mkdir(n.path, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"systemd-run", "systemctl", "sudo"} {
		if err := os.Symlink(binary, filepath.Join(n.path, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(n.script, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, pid := range n.pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	return n
}

// run runs a command on the node's PATH, returning its combined output
// and exit code. Its output is a pipe: a unit that kept it would hang it.
func (n *node) run(args ...string) (string, int) {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Our commands by their path: exec.Command looks on the test's PATH.
	name := args[0]
	if _, err := os.Stat(filepath.Join(n.path, name)); err == nil {
		name = filepath.Join(n.path, name)
	}
	cmd := exec.CommandContext(ctx, name, args[1:]...)
	cmd.Env = append(os.Environ(), "PATH="+n.path+":"+os.Getenv("PATH"), dirEnv+"="+n.units)
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		n.t.Fatalf("%s: %v (%s)", args, err, out)
	}
	return string(out), cmd.ProcessState.ExitCode()
}

// ok runs a command that must succeed.
func (n *node) ok(args ...string) string {
	n.t.Helper()
	out, code := n.run(args...)
	if code != 0 {
		n.t.Fatalf("%s: exit %d: %s", args, code, out)
	}
	return out
}

// eventually polls cond until it holds, failing the test after a minute.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(time.Minute); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

var startLine = regexp.MustCompile(`start (\d+) child (\d+) args (.*)`)

// starts are the log's start lines: main pid, child pid, arguments.
func (n *node) starts(log string, want int) [][]string {
	n.t.Helper()
	var got [][]string
	eventually(n.t, fmt.Sprintf("%d start lines in %s", want, log), func() bool {
		data, _ := os.ReadFile(log)
		got = startLine.FindAllStringSubmatch(string(data), -1)
		return len(got) >= want
	})
	for _, m := range got {
		for _, s := range m[1:3] {
			pid, _ := strconv.Atoi(s)
			if !slices.Contains(n.pids, pid) {
				n.pids = append(n.pids, pid)
			}
		}
	}
	return got
}

func runs(pid string) bool {
	p, _ := strconv.Atoi(pid)
	_, ok := procStart(p)
	return ok
}

// The suite's use: start the kubelet's unit, find it, kill it, restart it,
// and stop it at the end.
func TestKubeletUnit(t *testing.T) {
	n := newNode(t)
	if out := n.ok("systemd-run", "--version"); !regexp.MustCompile(`^systemd 252 \(`).MatchString(out) {
		t.Errorf("systemd-run --version = %q", out)
	}

	log := filepath.Join(t.TempDir(), "kubelet.log")
	n.ok("systemd-run", "-p", "Delegate=true", "-p", "StandardError=append:"+log, "--unit=kubelet-20250102T030405.service",
		"--slice=runtime.slice", "--remain-after-exit", n.script, "a%%b", "$$HOME")
	// The unit outlives systemd-run, in a process group and session of
	// its own.
	first := n.starts(log, 1)[0]
	if first[3] != "a%b $HOME" {
		t.Errorf("the unit's arguments are %q, want them unescaped: a%%b $HOME", first[3])
	}
	pid, _ := strconv.Atoi(first[1])
	if pgid, _ := syscall.Getpgid(pid); pgid != pid {
		t.Errorf("the unit's process group is %d, want its own (%d)", pgid, pid)
	}
	if sid, _ := unix.Getsid(pid); sid == mustSid(t) {
		t.Errorf("the unit shares the test's session %d", sid)
	}
	if !runs(first[1]) || !runs(first[2]) {
		t.Fatalf("the unit's processes %s, %s do not run", first[1], first[2])
	}
	// stdout goes where stderr goes.
	eventually(t, "the unit's stdout in the log", func() bool {
		data, _ := os.ReadFile(log)
		return strings.Contains(string(data), "stdout "+first[1])
	})

	// findKubeletServiceName, running or not.
	name := regexp.MustCompile(`(kubelet-\w+)`)
	for _, args := range [][]string{{"list-units", "*kubelet*", "--state=running"}, {"list-units", "*kubelet*"}} {
		out := n.ok(append([]string{"sudo", "systemctl"}, args...)...)
		if m := name.FindString(out); m != "kubelet-20250102T030405" {
			t.Errorf("systemctl %s finds %q, want kubelet-20250102T030405:\n%s", args, m, out)
		}
		if !strings.Contains(out, "kubelet-20250102T030405.service loaded active running "+n.script+" a%b $HOME") {
			t.Errorf("systemctl %s: no running unit:\n%s", args, out)
		}
	}
	if out := n.ok("systemctl", "is-active", "kubelet-20250102T030405"); out != "active\n" {
		t.Errorf("is-active = %q", out)
	}

	// mustStopKubelet: reset-failed, kill; the unit remains, exited.
	n.ok("sudo", "systemctl", "reset-failed", "kubelet-20250102T030405")
	n.ok("sudo", "systemctl", "kill", "kubelet-20250102T030405")
	eventually(t, "the unit's processes to end", func() bool { return !runs(first[1]) && !runs(first[2]) })
	eventually(t, "the unit to have exited", func() bool {
		return strings.Contains(n.ok("systemctl", "list-units"), "kubelet-20250102T030405.service loaded active exited")
	})
	if out := n.ok("sudo", "systemctl", "list-units", "*kubelet*", "--state=running"); name.MatchString(out) {
		t.Errorf("list-units --state=running lists the killed unit:\n%s", out)
	}
	if out := n.ok("systemctl", "is-active", "kubelet-20250102T030405"); out != "active\n" {
		t.Errorf("is-active of a unit exited, remaining = %q", out)
	}

	// ... and restart: a new process, the log appended.
	n.ok("sudo", "systemctl", "restart", "kubelet-20250102T030405")
	second := n.starts(log, 2)[1]
	if second[1] == first[1] || second[3] != "a%b $HOME" || !runs(second[1]) {
		t.Errorf("after restart, the start lines are %q then %q", first, second)
	}
	data, _ := os.ReadFile(log)
	if !strings.HasPrefix(string(data), first[0]) {
		t.Errorf("the log was not appended to:\n%s", data)
	}

	// restart of a running unit stops it first.
	n.ok("systemctl", "restart", "kubelet-20250102T030405.service")
	third := n.starts(log, 3)[2]
	if runs(second[1]) || !runs(third[1]) {
		t.Errorf("after restart of a running unit, %s runs: %v, %s runs: %v", second[1], runs(second[1]), third[1], runs(third[1]))
	}

	// E2EServices.Stop: systemctl kill, then stop, which unloads the
	// unit.
	n.ok("systemctl", "kill", "kubelet-20250102T030405.service")
	n.ok("sudo", "systemctl", "stop", "kubelet-20250102T030405.service")
	if runs(third[1]) {
		t.Errorf("%s runs after stop", third[1])
	}
	if out := n.ok("systemctl", "list-units"); !strings.HasPrefix(out, "0 loaded units listed.") {
		t.Errorf("after stop, list-units = %q", out)
	}
	if out, code := n.run("systemctl", "is-active", "kubelet-20250102T030405"); out != "inactive\n" || code != 3 {
		t.Errorf("is-active after stop = %q, exit %d; want inactive, 3", out, code)
	}
	if out, code := n.run("systemctl", "restart", "kubelet-20250102T030405"); code != 5 || !strings.Contains(out, "not loaded") {
		t.Errorf("restart after stop: exit %d, %q; want 5, not loaded", code, out)
	}
}

// stop sends SIGTERM, waits for the main process, and signals the whole
// group.
func TestStop(t *testing.T) {
	n := newNode(t)
	log := filepath.Join(t.TempDir(), "log")
	n.ok("systemd-run", "-p", "StandardError=append:"+log, "--unit=u", n.script)
	start := n.starts(log, 1)[0]
	n.ok("systemctl", "stop", "u")
	if runs(start[1]) {
		t.Errorf("%s runs after stop", start[1])
	}
	eventually(t, "the unit's child to end", func() bool { return !runs(start[2]) })
	// Without --remain-after-exit, a unit that ended well is unloaded.
	if out := n.ok("systemctl", "list-units"); !strings.HasPrefix(out, "0 loaded units listed.") {
		t.Errorf("after stop, list-units = %q", out)
	}
}

// A unit whose command fails is failed until started again; one that
// ends well without --remain-after-exit is unloaded.
func TestExits(t *testing.T) {
	n := newNode(t)
	ran := filepath.Join(t.TempDir(), "ran")
	n.ok("systemd-run", "--unit=fails", "sh", "-c", "echo >>"+ran+"; exit 3")
	n.ok("systemd-run", "--unit=ends", "sh", "-c", "exit 0")
	n.ok("systemd-run", "--remain-after-exit", "--unit=remains", "sh", "-c", "exit 0")
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	want := "● fails.service   loaded failed failed " + sh + " -c echo >>" + ran + "; exit 3\n" +
		"  remains.service loaded active exited " + sh + " -c exit 0\n"
	var out string
	for end := time.Now().Add(time.Minute); !strings.Contains(out, want) || strings.Contains(out, "ends"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("list-units = %q, want the units failed, exited and unloaded:\n%s", out, want)
		}
		out = n.ok("systemctl", "list-units")
	}
	if out, code := n.run("systemctl", "is-active", "fails", "ends"); out != "failed\ninactive\n" || code != 3 {
		t.Errorf("is-active = %q, exit %d", out, code)
	}
	if out, code := n.run("systemd-run", "--unit=fails", "true"); code != 1 || !strings.Contains(out, "fails.service was already loaded") {
		t.Errorf("systemd-run of a failed unit's name: exit %d, %q", code, out)
	}
	// start on an active unit does nothing; on a failed one it runs the
	// command again. reset-failed leaves it loaded.
	n.ok("systemctl", "start", "remains")
	n.ok("systemctl", "reset-failed", "fails")
	n.ok("systemctl", "start", "fails")
	eventually(t, "the unit to fail again", func() bool {
		data, _ := os.ReadFile(ran)
		out, _ := n.run("systemctl", "is-active", "fails")
		return string(data) == "\n\n" && out == "failed\n"
	})
	if out, code := n.run("systemd-run", "--unit=bad", "/nonexistent/command"); code != 1 || !strings.Contains(out, "/nonexistent/command") {
		t.Errorf("systemd-run of a missing command: exit %d, %q", code, out)
	}
	// A command that cannot start: the supervisor records it failed.
	badExec := filepath.Join(t.TempDir(), "bad")
	if err := os.WriteFile(badExec, []byte("#!/nonexistent/interpreter\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, code := n.run("systemd-run", "--unit=badexec", badExec); code != 1 || !strings.Contains(out, "badexec.service: fork/exec "+badExec) {
		t.Errorf("systemd-run of a command that cannot start: exit %d, %q", code, out)
	}
	if out, code := n.run("systemctl", "is-active", "badexec"); out != "failed\n" || code != 3 {
		t.Errorf("is-active of a unit that could not start = %q, exit %d", out, code)
	}
	// A unit's log, where neither output is named.
	if data, err := os.ReadFile(filepath.Join(n.units, "fails.service.log")); err != nil || len(data) != 0 {
		t.Errorf("fails.service.log: %q, %v", data, err)
	}
}

// Commands that change units run one at a time: two restarts at once
// leave one process running, the unit's.
func TestConcurrentRestarts(t *testing.T) {
	n := newNode(t)
	log := filepath.Join(t.TempDir(), "log")
	n.ok("systemd-run", "-p", "StandardError=append:"+log, "--unit=u", "--remain-after-exit", n.script)
	n.starts(log, 1)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { n.ok("systemctl", "restart", "u") })
	}
	wg.Wait()
	u, err := load(n.units, "u.service")
	if err != nil {
		t.Fatal(err)
	}
	// Only the unit's process group runs the script (its main process,
	// and the child it forks, until that execs sleep). The second restart
	// may stop the first's process before it logs: the log cannot tell.
	running := n.scriptProcs()
	if !slices.Contains(running, u.MainPID) {
		t.Errorf("after two restarts, the unit's main process %d does not run", u.MainPID)
	}
	for _, pid := range running {
		if pgid, _ := unix.Getpgid(pid); pgid != u.MainPID {
			t.Errorf("after two restarts, %d runs the unit's script, in group %d, not the unit's %d", pid, pgid, u.MainPID)
		}
	}
	n.ok("systemctl", "stop", "u")
	if runs(strconv.Itoa(u.MainPID)) {
		t.Errorf("after stop, the unit's main process %d runs", u.MainPID)
	}
	eventually(t, "the unit's other processes to end", func() bool { return len(n.scriptProcs()) == 0 })
}

// scriptProcs are the processes that run the node's unit script.
func (n *node) scriptProcs() []int {
	n.t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		n.t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if _, runs := procStart(pid); runs && slices.Contains(strings.Split(string(cmdline), "\x00"), n.script) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func TestErrors(t *testing.T) {
	n := newNode(t)
	for _, tc := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"systemctl", "mask", "locksmithd"}, 1, "systemctl: 'systemctl mask' is not implemented by fakesystemd"},
		{[]string{"systemd-run", "--scope", "true"}, 1, "systemd-run: option --scope is not implemented by fakesystemd"},
		{[]string{"systemctl", "kill", "nothing"}, 5, "failed to kill nothing.service: Unit nothing.service not loaded."},
		{[]string{"sudo", "sh", "-c", "echo $0 ran; exit 7"}, 7, "sh ran\n"},
		{[]string{"sudo", "-n", "true"}, 1, "fakesystemd implements only 'sudo COMMAND [ARGS...]'"},
		{[]string{"env", dirEnv + "=", "systemctl", "list-units"}, 1, dirEnv + " is not set"},
	} {
		if out, code := n.run(tc.args...); code != tc.code || !strings.Contains(out, tc.out) {
			t.Errorf("%s: exit %d, %q; want %d, %q", tc.args, code, out, tc.code, tc.out)
		}
	}
}

func mustSid(t *testing.T) int {
	sid, err := unix.Getsid(0)
	if err != nil {
		t.Fatal(err)
	}
	return sid
}
