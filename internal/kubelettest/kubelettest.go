// Package kubelettest runs a kubelet (the stock one or a fork) as a process
// against testenv's API server, as a node runs it: on the fake container
// runtime of the kubelet's hollow node (k8s.io/cri-client/pkg/fake: no
// containers, every volume call real) or on a real one (package realnode:
// containerd and runc), with a KubeletConfiguration for this kind of
// machine, a kubeconfig with the node's own client certificate, and the
// process started in an empty working directory of its own.
//
// The working directory matters: a fake runtime's containers have an empty
// log path, and when the kubelet removes one its log manager removes every
// file matching "{logPath}*", that is everything in its working directory.
package kubelettest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/cri-client/pkg/fake"
)

// Image is the image the fake runtime has already, for the pods' containers
// (with imagePullPolicy IfNotPresent or Never).
const Image = "busybox:latest"

// NodeUser is node's user name under the Node authorizer (the user of
// testenv.Env.NodeConfig's certificate).
func NodeUser(node string) string { return "system:node:" + node }

// APIServer is what a kubelet needs of the API server it talks to
// (testenv.Env is one): a kubeconfig naming it. It is an interface so
// that this package, which sits below testenv, does not import it.
type APIServer interface {
	// WriteKubeconfig writes a kubeconfig for cfg's credentials to path.
	WriteKubeconfig(path string, cfg *rest.Config) error
}

// StartRuntime serves the fake container runtime on unix socket sock,
// with Image present, until t ends.
func StartRuntime(t testing.TB, sock string) *fake.RemoteRuntime {
	t.Helper()
	rt := fake.NewFakeRemoteRuntime()
	// The kubelet refuses an image whose size is 0, as the fake's pulls
	// make them.
	rt.ImageService.SetFakeImageSize(4 << 20)
	rt.ImageService.SetFakeImages([]string{Image})
	if err := rt.Start("unix://" + sock); err != nil {
		t.Fatalf("starting the fake container runtime on %s: %v", sock, err)
	}
	t.Cleanup(rt.Stop)
	return rt
}

// FreePort returns a TCP port that was free on 127.0.0.1 a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// NodeReady tells whether node's Ready condition is True.
func NodeReady(ctx context.Context, client kubernetes.Interface, node string) (bool, error) {
	n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return false, err
	}
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c.Status == v1.ConditionTrue, nil
		}
	}
	return false, nil
}

// Options configures New. Bin, Dir, Node and NodeConfig are required.
type Options struct {
	// Bin is the kubelet binary.
	Bin string
	// Dir is the scratch directory: the kubelet's root directory
	// ({Dir}/root), its config, kubeconfig, certificates, logs, the fake
	// runtime's socket and the working directory. The caller removes it
	// (Unmount first: the kubelet bind-mounts its root onto itself).
	Dir string
	// Env is the API server the kubelet talks to (a *testenv.Env).
	Env APIServer
	// Node is the node's name (--hostname-override).
	Node string
	// NodeConfig is the node's credentials (testenv.Env.NodeConfig).
	NodeConfig *rest.Config
	// Args are appended to the kubelet's command line. Unset: none.
	Args []string
	// RuntimeEndpoint is the CRI endpoint of a real container runtime
	// (realnode.Runtime.Endpoint). Unset: the fake runtime, started by New.
	RuntimeEndpoint string
}

// Kubelet is a kubelet's files and fake runtime, started as a process
// (again, on the same root, after a Stop) by Start.
type Kubelet struct {
	opts Options
	// Root is the kubelet's --root-dir.
	Root string
	// ConfigFile and Kubeconfig are the files its flags name.
	ConfigFile, Kubeconfig string
	// Runtime is the fake container runtime it runs pods on; nil on a real
	// runtime (Options.RuntimeEndpoint).
	Runtime *fake.RemoteRuntime
}

// New starts the fake runtime (until t ends) unless opts names a real one,
// and writes the kubelet's config and kubeconfig under opts.Dir; Start
// starts the process.
func New(t testing.TB, opts Options) (*Kubelet, error) {
	t.Helper()
	if opts.Bin == "" || opts.Dir == "" || opts.Env == nil || opts.Node == "" || opts.NodeConfig == nil {
		return nil, fmt.Errorf("kubelettest: Bin, Dir, Env, Node and NodeConfig are required")
	}
	k := &Kubelet{opts: opts, Root: filepath.Join(opts.Dir, "root"),
		ConfigFile: filepath.Join(opts.Dir, "kubelet.yaml"), Kubeconfig: filepath.Join(opts.Dir, "node.kubeconfig")}
	forgetDevicePluginSocket(t)
	endpoint := opts.RuntimeEndpoint
	if endpoint == "" {
		sock := filepath.Join(opts.Dir, "cri.sock")
		k.Runtime = StartRuntime(t, sock)
		endpoint = "unix://" + sock
	}
	if err := opts.Env.WriteKubeconfig(k.Kubeconfig, opts.NodeConfig); err != nil {
		return nil, fmt.Errorf("writing node %s's kubeconfig: %w", opts.Node, err)
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	healthz, err := FreePort()
	if err != nil {
		return nil, err
	}
	cfg := Config{RuntimeEndpoint: endpoint, Port: port, HealthzPort: healthz, PodLogsDir: filepath.Join(opts.Dir, "pod-logs")}
	if err := WriteConfig(k.ConfigFile, cfg); err != nil {
		return nil, err
	}
	return k, nil
}

// Start starts the kubelet (its log is {Dir}/{name}.log, appended to
// across restarts); the process is stopped when t ends, if still running.
func (k *Kubelet) Start(t testing.TB, name string) *Process {
	t.Helper()
	args := append([]string{k.opts.Bin, "--config", k.ConfigFile, "--kubeconfig", k.Kubeconfig,
		"--root-dir", k.Root, "--cert-dir", filepath.Join(k.opts.Dir, "pki"),
		"--hostname-override", k.opts.Node}, k.opts.Args...)
	return StartProcess(t, k.opts.Dir, name, args)
}

// WaitNodeReady waits until the Node is Ready, p exits or ctx ends.
func (k *Kubelet) WaitNodeReady(ctx context.Context, p *Process, client kubernetes.Interface) error {
	return p.WaitFor(ctx, "node "+k.opts.Node+" Ready", func() bool {
		ok, _ := NodeReady(ctx, client, k.opts.Node)
		return ok
	})
}

// devicePluginDir is where every kubelet serves its device plugin
// registration socket (kubelet.sock), whatever its root directory.
const devicePluginDir = "/var/lib/kubelet/device-plugins"

// forgetDevicePluginSocket removes, when t ends (after the kubelets it
// started have stopped), what a kubelet made in devicePluginDir that was
// not there before: its socket, then that directory and /var/lib/kubelet
// if they are empty then. What was there before (the machine's own
// kubelet's) is not the test's to clean.
func forgetDevicePluginSocket(t testing.TB) {
	paths := []string{filepath.Join(devicePluginDir, "kubelet.sock"), devicePluginDir, filepath.Dir(devicePluginDir)}
	var made []string
	for _, p := range paths {
		if _, err := os.Lstat(p); os.IsNotExist(err) {
			made = append(made, p)
		}
	}
	t.Cleanup(func() {
		for _, p := range made {
			_ = os.Remove(p) // a directory only if empty
		}
	})
}

// ensureDir makes dir.
func ensureDir(dir string) error { return os.MkdirAll(dir, 0o750) }
