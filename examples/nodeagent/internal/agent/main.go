// Package agent is the nodeagent command: a node agent built on nodevol
// that mounts the CSI volumes of the pods bound to its node and unmounts
// them when the pods go. examples/nodeagent is its production binary;
// examples/nodeagent/demo runs it in its tests.
package agent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

type options struct {
	kubeconfig string
	node       string
	rootDir    string
	drivers    stringList
	// registration turns on plugin registration through {root}/plugins_registry.
	registration bool
	// reportInUse keeps the Node's status.volumesInUse up to date.
	reportInUse bool
	// clusterInformers lists and watches every claim, volume and
	// attachment of the cluster (volumemanager.Config.ClusterInformers)
	// instead of reading those of the node's pods one at a time.
	clusterInformers bool
	// volumePluginDir is the directory of flexVolume drivers
	// (volumemanager.Config.VolumePluginDir); empty: the kubelet's default.
	volumePluginDir string
	// selfAttach makes the node create and delete VolumeAttachments itself
	// (volumemanager.Config.SelfAttach).
	selfAttach bool
	// httpEndpoint is where /metrics and /healthz are served; empty: nowhere.
	httpEndpoint string
	// profilingAddress is the loopback address of /debug/pprof/; empty:
	// no profiling endpoint.
	profilingAddress string
	// shutdownGrace bounds how long operations in flight at SIGTERM may go on.
	shutdownGrace time.Duration
	// qps and burst are the API client's rate limit (the kubelet's
	// kubeAPIQPS and kubeAPIBurst, whose defaults they take).
	qps   float64
	burst int
	// version prints the build's version and exits.
	version bool
}

type stringList []string

func (s *stringList) String() string     { return fmt.Sprint(*s) }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// Main runs the nodeagent command with args (the command line without the
// program name) until SIGTERM or SIGINT, and returns its exit code.
func Main(args []string) int {
	var o options
	fs := newFlagSet(&o)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	build := readBuildVersion()
	if o.version {
		fmt.Println(build)
		return 0
	}
	defer klog.Flush()
	if o.node == "" {
		o.node = defaultNodeName(os.Getenv, os.Hostname)
	}
	if o.node == "" {
		fmt.Fprintln(os.Stderr, "nodeagent: no --node, no $NODE_NAME and no host name")
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background())
	// One line that says which agent runs, with what, before anything can
	// fail: the first thing to read in a node's log.
	klog.FromContext(ctx).Info("Node agent starting", "version", build.Version, "revision", build.revision(),
		"goVersion", build.GoVersion, "node", o.node, "rootDir", o.rootDir, "pluginRegistration", o.registration,
		"reportVolumesInUse", o.reportInUse, "clusterInformers", o.clusterInformers, "selfAttach", o.selfAttach,
		"kubeAPIQPS", o.qps, "kubeAPIBurst", o.burst)
	if err := runAgent(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "nodeagent:", err)
		return 1
	}
	return 0
}

// newFlagSet returns the command's flags (klog's included), set into o.
func newFlagSet(o *options) *flag.FlagSet {
	fs := flag.NewFlagSet("nodeagent", flag.ContinueOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster config)")
	fs.StringVar(&o.node, "node", "", "this node's name (default: $NODE_NAME, set from the downward API spec.nodeName in a DaemonSet; then the host name)")
	fs.StringVar(&o.rootDir, "root-dir", "/var/lib/kubelet", "kubelet-style root directory: pods/, plugins/ and plugins_registry/ under it")
	fs.Var(&o.drivers, "driver", "a CSI driver as name=/path/to/csi.sock (repeatable)")
	fs.BoolVar(&o.registration, "plugin-registration", true, "register the CSI drivers whose registrars announce them in {root-dir}/plugins_registry (a kubelet must not use the same root directory: the agent refuses to start beside a running one; see docs/OPERATIONS.md)")
	fs.BoolVar(&o.reportInUse, "report-volumes-in-use", true, "keep the Node's status.volumesInUse up to date, as the kubelet does (turn off when something else reports it: a kubelet on the same node overwrites it)")
	fs.BoolVar(&o.clusterInformers, "cluster-informers", false, "list and watch every PVC, PV and VolumeAttachment of the cluster (informers) instead of reading those of the node's pods one at a time with GET: no request per volume, but memory and the first list grow with the cluster, and the credentials need list and watch on them (a node's own, under the Node authorizer, may not)")
	fs.StringVar(&o.volumePluginDir, "volume-plugin-dir", "", "the directory of flexVolume drivers, as the kubelet's --volume-plugin-dir: each {vendor~driver}/{driver} executable there is a driver (default: the kubelet's, /usr/libexec/kubernetes/kubelet-plugins/volume/exec/)")
	fs.BoolVar(&o.selfAttach, "self-attach", false, "attach volumes from the node (create and delete their VolumeAttachments), as the kubelet with --enable-controller-attach-detach=false; the Node's controller-managed-attach-detach annotation is removed")
	fs.StringVar(&o.httpEndpoint, "http-endpoint", "", "TCP address of the HTTP server for /metrics (Prometheus) and /healthz (liveness), e.g. :8080 (default: no server)")
	fs.StringVar(&o.profilingAddress, "profiling-address", "", "loopback TCP address of the Go runtime's profiles (/debug/pprof/: heap, CPU, goroutines), e.g. 127.0.0.1:6060; for debugging on the node (default: none)")
	fs.DurationVar(&o.shutdownGrace, "shutdown-grace-period", 20*time.Second, "on SIGTERM, how long CSI operations in flight may go on before they are cancelled (no new one starts); keep it below the pod's terminationGracePeriodSeconds")
	fs.Float64Var(&o.qps, "kube-api-qps", 50, "requests per second to the API server, as the kubelet's --kube-api-qps (client-go's own default, 5, makes 50 pods' service account tokens take 8 s)")
	fs.IntVar(&o.burst, "kube-api-burst", 100, "requests allowed at once above --kube-api-qps, as the kubelet's --kube-api-burst")
	fs.BoolVar(&o.version, "version", false, "print the agent's version (module version, VCS revision, Go release) and exit")
	klog.InitFlags(fs)
	return fs
}

// defaultNodeName is the node's name when --node is not given: $NODE_NAME
// (a DaemonSet sets it from the downward API's spec.nodeName: in a pod,
// the host name is the pod's), then the host name.
func defaultNodeName(getenv func(string) string, hostname func() (string, error)) string {
	if n := getenv("NODE_NAME"); n != "" {
		return n
	}
	n, err := hostname()
	if err != nil {
		return ""
	}
	return n
}

// logWarning logs msg and its key/value pairs at warning level (klog's W
// header), in the form of klog's structured lines. The contextual logger
// (logr) has info and error only; a condition that needs an operator's
// look but is no error goes here, never to info with "Warning" in its text.
func logWarning(msg string, keysAndValues ...any) {
	var b strings.Builder
	b.WriteString(strconv.Quote(msg))
	for i := 0; i+1 < len(keysAndValues); i += 2 {
		fmt.Fprintf(&b, " %v=%s", keysAndValues[i], strconv.Quote(fmt.Sprint(keysAndValues[i+1])))
	}
	klog.WarningDepth(1, b.String())
}
