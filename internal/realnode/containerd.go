package realnode

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Options configures Start. Dir is required.
type Options struct {
	// Dir is the runtime's directory: containerd's config, root, state,
	// socket and log, the runc root and the CNI configuration, all below
	// it. It is made if missing; Stop removes it. Keep it short: the
	// socket's path must fit a unix socket address (107 bytes).
	Dir string
	// PodSubnet, if set, gives pods that are not hostNetwork a network:
	// the CNI bridge plugin's bridge cni0, with addresses from PodSubnet
	// (host-local), in containerd's network namespace. Use it only with
	// NetNS (a bridge in the host's namespace would add an address to the
	// host). Unset: loopback only, for hostNetwork pods (any other pod's
	// sandbox then fails: containerd wants an address for the pod).
	PodSubnet string
	// NetNS, if set, is a network namespace's path (NetNS.Path) that
	// containerd runs in, so that hostNetwork pods and the pods' bridge are
	// in it. Unset: the test's own namespace.
	NetNS string
	// Images are imported before Start returns (ImportImages).
	Images []Image
	// Mirror, when set, is the URL of a Registry ("http://10.230.0.1:5000")
	// that containerd pulls RegistryHost's images from instead of
	// RegistryHost itself: a pull reaches nothing outside the machine.
	Mirror string
}

// Runtime is containerd and runc started by Start, serving the CRI on
// Endpoint.
type Runtime struct {
	// Endpoint is the CRI endpoint ("unix:///.../containerd.sock"), for
	// the kubelet's containerRuntimeEndpoint and imageServiceEndpoint.
	Endpoint string

	dir, sock, runcRoot string
	cmd                 *exec.Cmd
	exited              chan struct{}
	conn                *grpc.ClientConn
	cri                 runtimeapi.RuntimeServiceClient
}

// The Debian packages' binaries (containerd, runc,
// containernetworking-plugins), installed by the Makefile.
const (
	containerdBin = "/usr/bin/containerd"
	ctrBin        = "/usr/bin/ctr"
	runcBin       = "/usr/sbin/runc"
	cniBinDir     = "/usr/lib/cni"
)

// Missing names the packages this machine lacks for a real node ("":
// none), for a test's skip message.
func Missing() string {
	var missing []string
	for bin, pkg := range map[string]string{containerdBin: "containerd", runcBin: "runc",
		filepath.Join(cniBinDir, "loopback"): "containernetworking-plugins", "/bin/busybox": "busybox-static"} {
		if _, err := os.Stat(bin); err != nil {
			missing = append(missing, pkg)
		}
	}
	if _, err := exec.LookPath("nsenter"); err != nil {
		missing = append(missing, "util-linux")
	}
	return strings.Join(missing, " ")
}

// configTemplate is containerd 1.6's configuration for a node of this kind
// of machine: everything below the runtime's directory (the sandboxes'
// network namespaces included), the native snapshotter, oom_score_adj
// never lowered (this machine refuses it, and runc then fails the
// sandbox), runc with cgroupfs (crun refuses the hybrid cgroup layout), the
// CRI streaming server on loopback at a free port.
const configTemplate = `version = 2
root = %[1]q
state = %[2]q

[grpc]
  address = %[3]q

[ttrpc]
  address = %[4]q

[debug]
  level = "info"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[6]q
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_apparmor = true
  enable_selinux = false
  tolerate_missing_hugetlb_controller = true
  disable_hugetlb_controller = true

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[7]q
    conf_dir = %[8]q

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = %[9]q
        Root = %[10]q
        SystemdCgroup = false

    # The handler the suites' RuntimeClass specs name (their
    # PreconfiguredRuntimeClassHandler), runc again, as upstream's node e2e
    # configures containerd.
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.test-handler]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.test-handler.options]
        BinaryName = %[9]q
        Root = %[10]q
        SystemdCgroup = false
`

// mirrorTemplate makes a registry's only endpoint a mirror (containerd
// 1.6's CRI registry configuration): plain HTTP for an http:// URL.
const mirrorTemplate = `
[plugins."io.containerd.grpc.v1.cri".registry.mirrors.%q]
  endpoint = [%q]
`

// loopbackConf is the CNI network of a node whose pods are all hostNetwork:
// containerd reports NetworkReady once a network is configured.
const loopbackConf = `{"cniVersion": "1.0.0", "name": "nodevol-lo", "plugins": [{"type": "loopback"}]}`

// bridgeConf is the pods' network with a PodSubnet: a bridge in
// containerd's network namespace, an address from the subnet for each pod,
// a default route through the bridge (which goes no further: the node's
// namespace has no route out).
const bridgeConf = `{"cniVersion": "1.0.0", "name": "nodevol-pods", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}},
  {"type": "loopback"}
]}`

// Start starts containerd with opts (its log is {Dir}/containerd.log),
// waits until its CRI says the runtime and the network are ready, and
// imports opts.Images. On error nothing is left running.
func Start(ctx context.Context, opts Options) (*Runtime, error) {
	if opts.Dir == "" {
		return nil, errors.New("realnode: Options.Dir is required")
	}
	if m := Missing(); m != "" {
		return nil, fmt.Errorf("realnode: this machine lacks the packages %s", m)
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, err
	}
	r := &Runtime{dir: dir, sock: filepath.Join(dir, "containerd.sock"), runcRoot: filepath.Join(dir, "runc")}
	if len(r.sock) > 107 {
		return nil, fmt.Errorf("realnode: the socket path %s is too long for a unix socket: use a shorter Dir", r.sock)
	}
	r.Endpoint = "unix://" + r.sock
	cniDir := filepath.Join(dir, "cni")
	for _, d := range []string{dir, cniDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	conf, confName := loopbackConf, "10-nodevol-lo.conflist"
	if opts.PodSubnet != "" {
		conf, confName = fmt.Sprintf(bridgeConf, opts.PodSubnet, filepath.Join(dir, "ipam")), "10-nodevol-pods.conflist"
	}
	if err := os.WriteFile(filepath.Join(cniDir, confName), []byte(conf), 0o600); err != nil {
		return nil, err
	}
	config := fmt.Sprintf(configTemplate, filepath.Join(dir, "root"), filepath.Join(dir, "state"), r.sock,
		filepath.Join(dir, "ttrpc.sock"), filepath.Join(dir, "opt"), PauseImage, cniBinDir, cniDir, runcBin, r.runcRoot)
	if opts.Mirror != "" {
		config += fmt.Sprintf(mirrorTemplate, RegistryHost, opts.Mirror)
	}
	configPath := filepath.Join(dir, "containerd.toml")
	if err := os.WriteFile(configPath, []byte(config), 0o600); err != nil {
		return nil, err
	}
	log, err := os.OpenFile(filepath.Join(dir, "containerd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	args := []string{containerdBin, "--config", configPath}
	if opts.NetNS != "" {
		args = InNetNS(opts.NetNS, args)
	}
	r.cmd = exec.Command(args[0], args[1:]...)
	r.cmd.Stdout, r.cmd.Stderr = log, log
	// A group of its own (Stop signals it alone), killed if the test dies.
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := r.cmd.Start(); err != nil {
		return nil, fmt.Errorf("realnode: starting containerd: %w", err)
	}
	r.exited = make(chan struct{})
	go func() { _ = r.cmd.Wait(); close(r.exited) }()
	if err := r.ready(ctx); err != nil {
		return nil, errors.Join(err, r.Stop(context.WithoutCancel(ctx)))
	}
	if err := r.ImportImages(ctx, opts.Images...); err != nil {
		return nil, errors.Join(err, r.Stop(context.WithoutCancel(ctx)))
	}
	return r, nil
}

// ready connects to the CRI and waits until its status says the runtime
// and the network are ready, containerd exits, or ctx ends.
func (r *Runtime) ready(ctx context.Context) error {
	conn, err := grpc.NewClient("unix://"+r.sock, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", r.sock)
		}))
	if err != nil {
		return fmt.Errorf("realnode: the CRI client: %w", err)
	}
	r.conn, r.cri = conn, runtimeapi.NewRuntimeServiceClient(conn)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		var last error
		st, err := r.cri.Status(ctx, &runtimeapi.StatusRequest{})
		if err == nil {
			last = nil
			for _, c := range st.GetStatus().GetConditions() {
				if !c.Status {
					last = fmt.Errorf("%s: %s %s", c.Type, c.Reason, c.Message)
				}
			}
			if last == nil {
				return nil
			}
		} else {
			last = err
		}
		select {
		case <-r.exited:
			return fmt.Errorf("realnode: containerd exited (log %s): %w", r.Log(), last)
		case <-ctx.Done():
			return fmt.Errorf("realnode: containerd not ready (log %s): %w", r.Log(), last)
		case <-tick.C:
		}
	}
}

// Log is containerd's log file.
func (r *Runtime) Log() string { return filepath.Join(r.dir, "containerd.log") }

// CRI is a client of the runtime's CRI runtime service.
func (r *Runtime) CRI() runtimeapi.RuntimeServiceClient { return r.cri }

// Images is the CRI's image service on the same connection.
func (r *Runtime) Images() runtimeapi.ImageServiceClient {
	return runtimeapi.NewImageServiceClient(r.conn)
}

// Ctr runs containerd's ctr against this runtime in the CRI's namespace
// (k8s.io) and returns its output.
func (r *Runtime) Ctr(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, ctrBin, append([]string{"--address", r.sock, "--namespace", "k8s.io"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("ctr %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return out, nil
}

// ImportImages writes each image as an archive below the runtime's
// directory and imports it, unpacked for the CRI's snapshotter.
func (r *Runtime) ImportImages(ctx context.Context, images ...Image) error {
	dir := filepath.Join(r.dir, "images")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for i, img := range images {
		archive := filepath.Join(dir, fmt.Sprintf("%d.tar", i))
		if err := WriteArchive(img, archive); err != nil {
			return err
		}
		if _, err := r.Ctr(ctx, "images", "import", "--snapshotter", "native", archive); err != nil {
			return fmt.Errorf("realnode: importing image %s: %w", img.Name, err)
		}
		if err := os.Remove(archive); err != nil {
			return err
		}
	}
	return nil
}
