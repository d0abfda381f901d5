package agent

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/nodevol/nodevol/testenv"
)

// agentProcessEnv, set to "1" in the environment of this test binary,
// makes it the nodeagent command (Main with its command line): what
// examples/nodeagent runs.
const agentProcessEnv = "NODEVOL_TEST_RUN_AGENT"

func TestMain(m *testing.M) {
	if os.Getenv(agentProcessEnv) == "1" {
		os.Exit(Main(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// agentProcess is the nodeagent command run as a process of this test
// binary against a testenv API server, as a DaemonSet runs it: no --node
// but NODE_NAME in its environment, an admin kubeconfig, --http-endpoint
// on a free port, its log in a file.
type agentProcess struct {
	t      *testing.T
	cmd    *exec.Cmd
	log    string
	exited chan error
	// base is the HTTP endpoint's URL, known once waitHealthy returned.
	base string
}

// startAgentProcess creates the Node node and starts the agent for it on
// a fresh root directory, with args after the flags it always has. The
// process is killed when the test ends; its log is printed if it failed.
func startAgentProcess(t *testing.T, api *testenv.Env, node string, args ...string) *agentProcess {
	t.Helper()
	admin := kubernetes.NewForConfigOrDie(api.Config())
	if _, err := admin.CoreV1().Nodes().Create(t.Context(), &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	kubeconfig := filepath.Join(root, "kubeconfig")
	if err := api.WriteKubeconfig(kubeconfig, api.Config()); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	a := &agentProcess{t: t, log: filepath.Join(root, "agent.log"), exited: make(chan error, 1)}
	logFile, err := os.Create(a.log)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	a.cmd = exec.Command(self, append([]string{"--kubeconfig", kubeconfig, "--root-dir", filepath.Join(root, "kubelet"),
		"--http-endpoint", "127.0.0.1:0"}, args...)...)
	a.cmd.Env = append(os.Environ(), agentProcessEnv+"=1", "NODE_NAME="+node)
	a.cmd.Stdout, a.cmd.Stderr = logFile, logFile
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { a.exited <- a.cmd.Wait() }()
	t.Cleanup(func() {
		_ = a.cmd.Process.Kill()
		if t.Failed() {
			data, _ := os.ReadFile(a.log)
			t.Logf("agent log:\n%s", data)
		}
	})
	return a
}

// readLog returns the agent's log with klog's escaped quotes unescaped.
func (a *agentProcess) readLog() string {
	a.t.Helper()
	data, err := os.ReadFile(a.log)
	if err != nil {
		a.t.Fatal(err)
	}
	return strings.ReplaceAll(string(data), `\"`, `"`)
}

// poll waits until cond holds, failing the test if the agent exits first
// or 30 s pass.
func (a *agentProcess) poll(what string, cond func() bool) {
	a.t.Helper()
	err := wait.PollUntilContextTimeout(a.t.Context(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		select {
		case err := <-a.exited:
			return false, errors.Join(errors.New("the agent exited"), err)
		default:
		}
		return cond(), nil
	})
	if err != nil {
		a.t.Fatalf("waiting for %s: %v", what, err)
	}
}

var addrRE = regexp.MustCompile(`"Serving /metrics and /healthz" address="([^"]+)"`)

// waitHealthy waits for the HTTP endpoint's address in the log, then for
// /healthz to answer ok (the agent has read its root directory and its
// pod informer has synced).
func (a *agentProcess) waitHealthy() {
	a.t.Helper()
	a.poll("the HTTP endpoint's address in the log", func() bool {
		if m := addrRE.FindStringSubmatch(a.readLog()); m != nil {
			a.base = "http://" + m[1]
		}
		return a.base != ""
	})
	a.poll("/healthz ok", func() bool {
		resp, err := http.Get(a.base + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// terminate sends SIGTERM and waits for the agent to exit: exit code 0 is
// a clean exit.
func (a *agentProcess) terminate() {
	a.t.Helper()
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		a.t.Fatal(err)
	}
	select {
	case err := <-a.exited:
		if err != nil {
			a.t.Errorf("after SIGTERM the agent exited with %v, want 0", err)
		}
	case <-time.After(30 * time.Second):
		a.t.Fatal("the agent did not exit within 30s of SIGTERM")
	}
}

// TestIntegrationAgentHTTPEndpoint runs the nodeagent command as a process
// against a real kube-apiserver, as a DaemonSet runs it: /healthz answers
// ok once the agent has synced, /metrics has the volume manager's, the
// process's and the Go runtime's metrics, and SIGTERM ends the agent
// cleanly.
func TestIntegrationAgentHTTPEndpoint(t *testing.T) {
	api := testenv.StartT(t, testenv.Options{})
	a := startAgentProcess(t, api, "node-http", "--shutdown-grace-period", "5s", "-v", "2")
	a.waitHealthy()
	if code, body := get(t, a.base+"/healthz"); code != http.StatusOK || body != "ok" {
		t.Errorf("/healthz = %d %q, want 200 \"ok\"", code, body)
	}
	code, metrics := get(t, a.base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics = %d:\n%s", code, metrics)
	}
	for _, want := range []string{
		"reconstruct_volume_operations_total 0\n", // the volume manager's
		"process_start_time_seconds ",
		"go_goroutines ",
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics has no %q:\n%s", want, metrics)
		}
	}
	if log := a.readLog(); !strings.Contains(log, `"Node agent running" node="node-http"`) {
		t.Error(`the agent's log has no "Node agent running"`)
	}
	a.terminate()
	if log := a.readLog(); !strings.Contains(log, `"Node agent stopped" node="node-http"`) {
		t.Error(`the agent's log has no "Node agent stopped"`)
	}
}

// klogHeader matches the header of a klog line at warning or error level
// (W or E, then MMDD and the time).
var klogHeader = regexp.MustCompile(`(?m)^[WE]\d{4} \d{2}:\d{2}:\d{2}\.\d{6} .*$`)

// infoWarning matches a klog line at info level whose message calls
// itself a warning.
var infoWarning = regexp.MustCompile(`(?mi)^I\d{4} .*\] "warning.*$`)

// TestIntegrationAgentCleanLog: an agent set up correctly, as the node's
// only volume manager (its defaults: plugin registration and volumes in
// use on, its Node registered), logs nothing at warning or error level
// from its start to its exit at SIGTERM, at the verbosity the DaemonSets
// use; and its first line says which build runs.
func TestIntegrationAgentCleanLog(t *testing.T) {
	api := testenv.StartT(t, testenv.Options{})
	a := startAgentProcess(t, api, "node-clean", "--shutdown-grace-period", "5s", "-v", "2")
	a.waitHealthy()
	a.terminate()
	log := a.readLog()
	if bad := klogHeader.FindAllString(log, -1); len(bad) > 0 {
		t.Errorf("a correct set-up logged %d lines at warning or error level:\n%s", len(bad), strings.Join(bad, "\n"))
	}
	// A warning logged at info level hides from whoever filters on W.
	if bad := infoWarning.FindAllString(log, -1); len(bad) > 0 {
		t.Errorf("lines at info level that are warnings:\n%s", strings.Join(bad, "\n"))
	}
	first, _, _ := strings.Cut(log, "\n")
	if !strings.Contains(first, `"Node agent starting"`) || !strings.Contains(first, `goVersion="`+runtime.Version()+`"`) ||
		!strings.Contains(first, `version="`) || !strings.Contains(first, `revision="`) {
		t.Errorf("the log's first line is not the version line: %s", first)
	}
}

// TestVersionFlag: --version prints one line, "nodeagent", the module
// version, the revision and the Go release, and exits 0 without starting
// (no kubeconfig, no API server).
func TestVersionFlag(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "--version")
	cmd.Env = append(os.Environ(), agentProcessEnv+"=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("--version: %v (output %q)", err, out)
	}
	re := regexp.MustCompile(`^nodeagent \S+ revision \S+ ` + regexp.QuoteMeta(runtime.Version()) + "\n$")
	if !re.Match(out) {
		t.Errorf("--version printed %q, want it to match %s", out, re)
	}
}
