package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"
)

// process is one running binary, its output going to a log file.
type process struct {
	name    string // "etcd" or "kube-apiserver", for errors
	cmd     *exec.Cmd
	logPath string
	log     *os.File
	done    chan struct{} // closed once the process has exited and been reaped
	err     error         // Wait's result, set before done is closed
}

// startProcess starts path with args, its stdout and stderr appended to
// logPath. The process gets a process group of its own (so that signals to
// the test's group do not reach it twice) and, on Linux, is killed if the
// test process dies first.
func startProcess(name, path string, args []string, logPath string) (*process, error) {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("testenv: %s: open log: %w", name, err)
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("testenv: start %s (%s): %w", name, path, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, log: log, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		log.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has exited.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM to the process's group, kills the group after grace,
// and returns once the process has been reaped. It is idempotent.
func (p *process) stop(grace time.Duration) {
	if p.exited() {
		return
	}
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	}
	// Anything left in the group (neither binary forks, but be sure).
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
}

// exitError describes an early exit with the tail of the process's log.
func (p *process) exitError(while string) error {
	return fmt.Errorf("testenv: %s exited %s: %v; last lines of %s:\n%s", p.name, while, p.err, p.logPath, tail(p.logPath, 20))
}

// waitReady polls probe every 100ms until it succeeds, the process exits
// (an error with the log's tail), timeout passes or ctx ends (an error with
// the probe's last failure and the log's tail).
func (p *process) waitReady(ctx context.Context, timeout time.Duration, probe func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		err := probe(pctx)
		pcancel()
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			return p.exitError("before it was ready")
		case <-ctx.Done():
			return fmt.Errorf("testenv: %s not ready: %w (last probe: %v); last lines of %s:\n%s",
				p.name, ctx.Err(), err, p.logPath, tail(p.logPath, 20))
		case <-tick.C:
		}
	}
}

// httpProbe returns a probe that GETs url with client and wants 200 OK.
func httpProbe(client *http.Client, url string, header http.Header) func(context.Context) error {
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		for k, v := range header {
			req.Header[k] = v
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s: %s", url, resp.Status, bytes.TrimSpace(body))
		}
		return nil
	}
}

// tail returns the last n lines of the file at path (at most its last 64
// KiB), or a note saying why it cannot be read.
func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(log unreadable: %v)", err)
	}
	defer f.Close()
	const window = 64 << 10
	if fi, err := f.Stat(); err == nil && fi.Size() > window {
		_, _ = f.Seek(-window, io.SeekEnd)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return fmt.Sprintf("(log unreadable: %v)", err)
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// freePorts returns n distinct free TCP ports on 127.0.0.1. They are free
// when returned; another process may take one before the caller binds it,
// in which case the binary exits early with "address already in use".
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("testenv: find a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// hostPort is 127.0.0.1:port.
func hostPort(port int) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// errAddrInUse reports whether an exit error's log shows a port taken
// between freePorts and the bind.
func addrInUse(p *process) bool {
	return p.exited() && bytes.Contains([]byte(tail(p.logPath, 50)), []byte("address already in use"))
}

var errStopped = errors.New("testenv: environment stopped")
