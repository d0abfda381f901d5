package kubeletbench

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodevol/nodevol/internal/kubelettest"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
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

// startKubelet starts the kubelet on the fake runtime with the node's
// credentials; it returns once the Node is Ready.
func startKubelet(b *testing.B, c *objCluster) *kubelettest.Process {
	b.Helper()
	k, err := kubelettest.New(b, kubelettest.Options{Bin: kubeletBin(b), Dir: c.scratch, Env: c.env, Node: objNode,
		NodeConfig: c.nodeCfg, Args: []string{"--v", "2"}})
	if err != nil {
		b.Fatal(err)
	}
	p := k.Start(b, "kubelet")
	ctx, cancel := context.WithTimeout(b.Context(), 2*time.Minute)
	defer cancel()
	if err := k.WaitNodeReady(ctx, p, c.admin); err != nil {
		b.Fatal(err)
	}
	return p
}

// startAgent creates the Node as the node (what the kubelet does when it
// registers) and starts the example node agent with the node's
// credentials (claims, volumes and attachments read one at a time, its
// default); it returns once its /healthz says ok (its
// informer of the node's pods has synced).
func startAgent(b *testing.B, c *objCluster) *kubelettest.Process {
	b.Helper()
	bin := nodeagent.Path(b)
	ctx := b.Context()
	if err := createNodeAsNode(ctx, c); err != nil {
		b.Fatal(err)
	}
	port, err := kubelettest.FreePort()
	if err != nil {
		b.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	p := kubelettest.StartProcess(b, c.scratch, "nodeagent", []string{bin, "--kubeconfig", c.kubeconfig, "--node", objNode,
		"--root-dir", filepath.Join(c.scratch, "root"), "--plugin-registration=false",
		"--http-endpoint", addr})
	waitCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	err = p.WaitFor(waitCtx, "the node agent's /healthz", func() bool {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if err != nil {
		b.Fatal(err)
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
