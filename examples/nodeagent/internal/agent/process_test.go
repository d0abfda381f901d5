package agent

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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

// TestIntegrationAgentHTTPEndpoint runs the nodeagent command as a process
// against a real kube-apiserver, as a DaemonSet runs it: no --node but
// NODE_NAME in its environment, --http-endpoint. /healthz answers ok once
// the agent has synced, /metrics has the volume manager's, the process's
// and the Go runtime's metrics, the log warns about the defaults that
// fight a kubelet, and SIGTERM ends the agent cleanly.
func TestIntegrationAgentHTTPEndpoint(t *testing.T) {
	api := testenv.StartT(t, testenv.Options{})
	ctx := t.Context()
	const node = "node-http"
	admin := kubernetes.NewForConfigOrDie(api.Config())
	if _, err := admin.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
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
	logPath := filepath.Join(root, "agent.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command(self, "--kubeconfig", kubeconfig, "--root-dir", filepath.Join(root, "kubelet"),
		"--http-endpoint", "127.0.0.1:0", "--shutdown-grace-period", "5s", "-v", "2")
	cmd.Env = append(os.Environ(), agentProcessEnv+"=1", "NODE_NAME="+node)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			data, _ := os.ReadFile(logPath)
			t.Logf("agent log:\n%s", data)
		}
	})
	readLog := func() string {
		data, err := os.ReadFile(logPath)
		if err != nil {
			t.Fatal(err)
		}
		return strings.ReplaceAll(string(data), `\"`, `"`)
	}
	poll := func(what string, cond func() bool) {
		t.Helper()
		err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			select {
			case err := <-exited:
				return false, errors.Join(errors.New("the agent exited"), err)
			default:
			}
			return cond(), nil
		})
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
	}

	addrRE := regexp.MustCompile(`"Serving /metrics and /healthz" address="([^"]+)"`)
	var base string
	poll("the HTTP endpoint's address in the log", func() bool {
		if m := addrRE.FindStringSubmatch(readLog()); m != nil {
			base = "http://" + m[1]
		}
		return base != ""
	})
	poll("/healthz ok", func() bool {
		resp, err := http.Get(base + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if code, body := get(t, base+"/healthz"); code != http.StatusOK || body != "ok" {
		t.Errorf("/healthz = %d %q, want 200 \"ok\"", code, body)
	}
	code, metrics := get(t, base+"/metrics")
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
	log := readLog()
	for _, want := range []string{
		`"Node agent running" node="node-http"`,
		`"Warning: --report-volumes-in-use is on`,
		`"Warning: --plugin-registration is on`,
	} {
		if !strings.Contains(log, want) {
			t.Errorf("the agent's log has no %s", want)
		}
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("after SIGTERM the agent exited with %v, want 0", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the agent did not exit within 30s of SIGTERM")
	}
	if log := readLog(); !strings.Contains(log, `"Node agent stopped" node="node-http"`) {
		t.Error(`the agent's log has no "Node agent stopped"`)
	}
}
