package kubeletbench

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/cri-client/pkg/fake"
)

// The node's process of each side of BenchmarkPodObjects: the stock
// kubelet v1.37.2 on a fake container runtime, or nodevol's example node
// agent; each with the node's own client certificate.

// kubeletVersion is the kubelet built for the benchmark: bench/kubelet's
// k8s.io/kubernetes.
const kubeletVersion = "v1.37.2"

var (
	kubeletBuild    sync.Once
	kubeletBinPath  string
	kubeletBuildErr error
	agentBuild      sync.Once
	agentBinPath    string
	agentBuildErr   error
)

// kubeletBin builds the stock kubelet (go.mod's tool k8s.io/kubernetes/cmd/kubelet,
// its version set at link time) into
// $XDG_CACHE_HOME/nodevol-kubelet/{version}/kubelet, once: a cold build takes
// minutes, so it is kept across runs.
func kubeletBin(b *testing.B) string {
	b.Helper()
	kubeletBuild.Do(func() {
		cache, err := os.UserCacheDir()
		if err != nil {
			kubeletBuildErr = err
			return
		}
		kubeletBinPath = filepath.Join(cache, "nodevol-kubelet", kubeletVersion, "kubelet")
		if _, err := os.Stat(kubeletBinPath); err == nil {
			return
		}
		if err := os.MkdirAll(filepath.Dir(kubeletBinPath), 0o755); err != nil {
			kubeletBuildErr = err
			return
		}
		const pkg = "k8s.io/component-base/version"
		major, minor, _ := strings.Cut(strings.TrimPrefix(kubeletVersion, "v"), ".")
		minor, _, _ = strings.Cut(minor, ".")
		ldflags := fmt.Sprintf("-s -w -X %[1]s.gitVersion=%[2]s -X %[1]s.gitMajor=%[3]s -X %[1]s.gitMinor=%[4]s -X %[1]s.gitTreeState=clean",
			pkg, kubeletVersion, major, minor)
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", ldflags, "-o", kubeletBinPath+".tmp", "k8s.io/kubernetes/cmd/kubelet")
		if out, err := cmd.CombinedOutput(); err != nil {
			kubeletBuildErr = fmt.Errorf("building the kubelet: %w\n%s", err, out)
			return
		}
		kubeletBuildErr = os.Rename(kubeletBinPath+".tmp", kubeletBinPath)
	})
	if kubeletBuildErr != nil {
		b.Fatal(kubeletBuildErr)
	}
	return kubeletBinPath
}

// agentBin builds the example node agent (examples/nodeagent, the
// production command) from nodevol's module into a directory of its own
// (removed by TestMain).
func agentBin(b *testing.B) string {
	b.Helper()
	agentBuild.Do(func() {
		dir, err := os.MkdirTemp("", "objbench-bin-")
		if err != nil {
			agentBuildErr = err
			return
		}
		agentBinPath = filepath.Join(dir, "nodeagent")
		cmd := exec.Command("go", "build", "-o", agentBinPath, "./examples/nodeagent")
		cmd.Dir = filepath.Join("..", "..")
		if out, err := cmd.CombinedOutput(); err != nil {
			agentBuildErr = fmt.Errorf("building the example node agent: %w\n%s", err, out)
		}
	})
	if agentBuildErr != nil {
		b.Fatal(agentBuildErr)
	}
	return agentBinPath
}

// nodeProc is the node's process, started with its working directory an
// empty directory of its own: the kubelet's container log manager removes
// files there when it removes a fake runtime's container (whose log path
// is empty).
type nodeProc struct {
	cmd    *exec.Cmd
	exited chan struct{}
	root   string
}

func startNodeProc(b *testing.B, c *objCluster, name string, args []string) *nodeProc {
	b.Helper()
	wd := filepath.Join(c.scratch, "wd")
	if err := os.MkdirAll(wd, 0o750); err != nil {
		b.Fatal(err)
	}
	log, err := os.Create(filepath.Join(c.scratch, name+".log"))
	if err != nil {
		b.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = wd, log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		b.Fatalf("starting the %s: %v", name, err)
	}
	p := &nodeProc{cmd: cmd, exited: make(chan struct{}), root: filepath.Join(c.scratch, "root")}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	b.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-p.exited
		}
	})
	return p
}

// waitReady polls ready every 100 ms until it holds, the process exits or
// timeout passes.
func (p *nodeProc) waitReady(what string, timeout time.Duration, ready func() bool) error {
	deadline := time.Now().Add(timeout)
	for !ready() {
		select {
		case <-p.exited:
			return fmt.Errorf("%s: the process exited", what)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %v", what, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

// rss is the process's resident set size (VmRSS of /proc/{pid}/status) in bytes.
func (p *nodeProc) rss() (uint64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
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
	return 0, fmt.Errorf("no VmRSS for pid %d", p.cmd.Process.Pid)
}

// kubeletConfig is the stock kubelet's configuration on this machine
// (cgroup v1, no cgroup hierarchy of its own, the fake runtime); every
// period (sync, node status, lease, configMap and secret watches) is left
// at its default.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupsPerQOS: false
enforceNodeAllocatable: []
cgroupDriver: cgroupfs
failSwapOn: false
resolvConf: ""
containerRuntimeEndpoint: unix://%[1]s
imageServiceEndpoint: unix://%[1]s
port: %[2]d
healthzPort: %[3]d
readOnlyPort: 0
podLogsDir: %[4]s
authentication:
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
`

// startKubelet serves the fake runtime on a socket in the scratch
// directory and starts the kubelet; it returns once the Node is Ready.
func startKubelet(b *testing.B, c *objCluster) *nodeProc {
	b.Helper()
	bin := kubeletBin(b)
	sock := filepath.Join(c.scratch, "cri.sock")
	rt := fake.NewFakeRemoteRuntime()
	// The pods' image is there already, with a size: the kubelet refuses
	// an image whose size is 0, as the fake's pulls make them.
	rt.ImageService.SetFakeImageSize(4 << 20)
	rt.ImageService.SetFakeImages([]string{"busybox:latest"})
	if err := rt.Start("unix://" + sock); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(rt.Stop)
	port, err := freePort()
	if err != nil {
		b.Fatal(err)
	}
	healthz, err := freePort()
	if err != nil {
		b.Fatal(err)
	}
	config := filepath.Join(c.scratch, "kubelet.yaml")
	data := fmt.Sprintf(kubeletConfig, sock, port, healthz, filepath.Join(c.scratch, "pod-logs"))
	if err := os.WriteFile(config, []byte(data), 0o600); err != nil {
		b.Fatal(err)
	}
	p := startNodeProc(b, c, "kubelet", []string{bin, "--config", config, "--kubeconfig", c.kubeconfig,
		"--root-dir", filepath.Join(c.scratch, "root"), "--cert-dir", filepath.Join(c.scratch, "pki"),
		"--hostname-override", objNode, "--v", "2"})
	ctx := b.Context()
	err = p.waitReady("the kubelet's Node Ready", 2*time.Minute, func() bool {
		node, err := c.admin.CoreV1().Nodes().Get(ctx, objNode, metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == v1.NodeReady {
				return cond.Status == v1.ConditionTrue
			}
		}
		return false
	})
	if err != nil {
		b.Fatalf("%v; the kubelet's log: %s", err, filepath.Join(c.scratch, "kubelet.log"))
	}
	return p
}

// startAgent creates the Node as the node (what the kubelet does when it
// registers) and starts the example node agent with the node's
// credentials, node-restricted; it returns once its /healthz says ok (its
// informer of the node's pods has synced).
func startAgent(b *testing.B, c *objCluster) *nodeProc {
	b.Helper()
	bin := agentBin(b)
	ctx := b.Context()
	if err := createNodeAsNode(ctx, c); err != nil {
		b.Fatal(err)
	}
	port, err := freePort()
	if err != nil {
		b.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	p := startNodeProc(b, c, "nodeagent", []string{bin, "--kubeconfig", c.kubeconfig, "--node", objNode,
		"--root-dir", filepath.Join(c.scratch, "root"), "--node-restricted", "--plugin-registration=false",
		"--http-endpoint", addr})
	err = p.waitReady("the node agent's /healthz", 2*time.Minute, func() bool {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if err != nil {
		b.Fatalf("%v; the agent's log: %s", err, filepath.Join(c.scratch, "nodeagent.log"))
	}
	return p
}

// createNodeAsNode creates the Node with the node's own credentials.
func createNodeAsNode(ctx context.Context, c *objCluster) error {
	client, err := kubernetes.NewForConfig(c.nodeCfg)
	if err != nil {
		return err
	}
	if _, err := client.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: objNode}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating node %s as the node: %w", objNode, err)
	}
	return nil
}
