package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Helpers that run the driver as a separate process, the way a CO does.

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// driverBinary builds ./examples/loopdriver once per test binary.
func driverBinary(tb testing.TB) string {
	tb.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "loopdriver-bin-")
		if buildErr != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(buildDir, "loopdriver"), ".")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = errors.New("go build: " + err.Error() + ": " + string(out))
		}
	})
	if buildErr != nil {
		tb.Fatal(buildErr)
	}
	return filepath.Join(buildDir, "loopdriver")
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// driverProc is a running driver process.
type driverProc struct {
	cmd  *exec.Cmd
	sock string
	done chan struct{}
	err  error // exit status, once done is closed
	log  *bytes.Buffer
}

// startDriver starts the driver on sock with its state in stateDir and
// waits until it answers Probe. The process is killed when tb ends.
func startDriver(tb testing.TB, sock, stateDir string, extra ...string) *driverProc {
	tb.Helper()
	args := append([]string{"--endpoint", "unix://" + sock, "--nodeid", "node-1", "--statedir", stateDir, "-v", "2"}, extra...)
	cmd := exec.Command(driverBinary(tb), args...)
	p := &driverProc{cmd: cmd, sock: sock, done: make(chan struct{}), log: &bytes.Buffer{}}
	cmd.Stdout, cmd.Stderr = &lockedWriter{w: p.log}, &lockedWriter{w: p.log}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("starting driver: %v", err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	tb.Cleanup(func() {
		p.stop(tb)
		if tb.Failed() {
			tb.Logf("driver log:\n%s", p.logText())
		}
	})
	conn := dial(tb, sock)
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{})
		cancel()
		if err == nil {
			return p
		}
		select {
		case <-p.done:
			tb.Fatalf("driver exited at start: %v\n%s", p.err, p.logText())
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("driver did not answer Probe: %v\n%s", err, p.logText())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop sends SIGTERM, then SIGKILL after 10 s.
func (p *driverProc) stop(tb testing.TB) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		tb.Errorf("driver did not stop on SIGTERM; killing it")
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// waitExit waits for the process to exit by itself and returns its code.
func (p *driverProc) waitExit(tb testing.TB, timeout time.Duration) int {
	tb.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		tb.Fatalf("driver still running after %v", timeout)
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	return 0
}

func (p *driverProc) logText() string {
	mu.Lock()
	defer mu.Unlock()
	return p.log.String()
}

var mu sync.Mutex

type lockedWriter struct{ w *bytes.Buffer }

func (l *lockedWriter) Write(b []byte) (int, error) {
	mu.Lock()
	defer mu.Unlock()
	return l.w.Write(b)
}

// dial connects to the driver's socket; the connection is closed when tb
// ends.
func dial(tb testing.TB, sock string) *grpc.ClientConn {
	tb.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatalf("dialing %s: %v", sock, err)
	}
	tb.Cleanup(func() { _ = conn.Close() })
	return conn
}

// loopDevicesUnder lists the loop devices whose backing file is under dir.
func loopDevicesUnder(tb testing.TB, dir string) []string {
	tb.Helper()
	out, err := exec.Command("losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE").Output()
	if err != nil {
		tb.Fatalf("losetup --list: %v", err)
	}
	var devs []string
	for line := range strings.Lines(string(out)) {
		if strings.Contains(line, dir+"/") {
			devs = append(devs, strings.TrimSpace(line))
		}
	}
	return devs
}

// mountsUnder lists the mount points under dir in /proc/self/mountinfo.
func mountsUnder(tb testing.TB, dir string) []string {
	tb.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	var mps []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && (fields[4] == dir || strings.HasPrefix(fields[4], dir+"/")) {
			mps = append(mps, fields[4])
		}
	}
	return mps
}

// checkNoLeaks fails tb if a loop device or mount under dir is left.
func checkNoLeaks(tb testing.TB, dir string) {
	tb.Helper()
	if devs := loopDevicesUnder(tb, dir); len(devs) > 0 {
		tb.Errorf("leaked loop devices: %v", devs)
		for _, d := range devs {
			_ = exec.Command("losetup", "--detach", strings.Fields(d)[0]).Run()
		}
	}
	if mps := mountsUnder(tb, dir); len(mps) > 0 {
		tb.Errorf("leaked mounts: %v", mps)
		for i := len(mps) - 1; i >= 0; i-- {
			_ = syscall.Unmount(mps[i], syscall.MNT_DETACH)
		}
	}
}
