package kubeletbench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// agentProc is nodevol: the example node agent's agent-fake.
type agentProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
}

// startAgent starts nodevol on the root with the pods wanted: it adds
// them, calls MarkPodsSynced at once and says SYNCED.
func (e *hvEnv) startAgent(wanted []*hvPod) *agentProc {
	e.t.Helper()
	data, err := json.Marshal(e.objects(wanted))
	if err != nil {
		e.t.Fatal(err)
	}
	file := filepath.Join(e.root, fmt.Sprintf("objects-%d.json", time.Now().UnixNano()))
	if err := os.WriteFile(file, data, 0o600); err != nil {
		e.t.Fatal(err)
	}
	args := []string{"agent-fake", "--root-dir", e.root, "--node", hvNode, "--objects", file, "--timeout", "2m"}
	for _, d := range e.drivers {
		args = append(args, "--driver", d.name+"="+d.sock)
	}
	cmd := exec.Command(nodeagentDemo.Path(e.t), args...)
	log, err := os.OpenFile(filepath.Join(e.root, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		e.t.Fatal(err)
	}
	defer log.Close()
	cmd.Stderr = log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	a := &agentProc{cmd: cmd, stdin: stdin, lines: make(chan string, 1024)}
	go func() {
		defer close(a.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			a.lines <- sc.Text()
		}
	}()
	e.agent = a
	return a
}

// expect reads the agent's lines until one starts with prefix; a FAILED
// line or the agent's exit fails the test.
func (a *agentProc) expect(t *testing.T, prefix string) string {
	t.Helper()
	timeout := time.After(3 * time.Minute)
	for {
		select {
		case line, ok := <-a.lines:
			if !ok {
				t.Fatalf("nodevol exited while waiting for %q", prefix)
			}
			if strings.HasPrefix(line, "FAILED") {
				t.Fatalf("nodevol: %s", line)
			}
			if strings.HasPrefix(line, prefix) {
				return line
			}
		case <-timeout:
			t.Fatalf("nodevol did not say %q within 3m", prefix)
		}
	}
}

func (a *agentProc) send(t *testing.T, line string) {
	t.Helper()
	if _, err := io.WriteString(a.stdin, line+"\n"); err != nil {
		t.Fatalf("nodevol: sending %q: %v", line, err)
	}
}

// stop stops nodevol with SIGTERM: it stops without tearing down.
func (e *hvEnv) stopAgent() {
	a := e.agent
	if a == nil {
		return
	}
	e.agent = nil
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = a.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = a.cmd.Process.Kill()
		<-done
	}
}
