// Command nodeagent is a node agent built on nodevol: it mounts the CSI
// volumes of the pods bound to its node and unmounts them when the pods go.
//
//	nodeagent --kubeconfig ~/.kube/config --node node-1   # drivers register through /var/lib/kubelet/plugins_registry
//	nodeagent --kubeconfig ~/.kube/config --node node-1 --plugin-registration=false --driver loop.csi.nodevol.io=/run/csi/loop.sock
//	nodeagent --demo     # everything embedded: fake API server, the loop driver, a few pods
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"
)

type options struct {
	demo       bool
	pods       int
	kubeconfig string
	node       string
	rootDir    string
	drivers    stringList
	// registration turns on plugin registration through {root}/plugins_registry.
	registration bool
	// reportInUse keeps the Node's status.volumesInUse up to date.
	reportInUse bool
	// nodeRestricted reads claims, volumes and attachments one at a time
	// (volumemanager.Config.NodeRestricted), for a node's own credentials.
	nodeRestricted bool
	// selfAttach makes the node create and delete VolumeAttachments itself
	// (volumemanager.Config.SelfAttach).
	selfAttach bool
}

// runSubcommand runs the hidden subcommands with which the demo starts the
// loop driver and its registrar as separate processes of this binary, and
// agent-fake, the node agent on a fake API server that end-to-end tests
// run as a separate process.
func runSubcommand(args []string) (code int, ok bool) {
	if len(args) == 0 {
		return 0, false
	}
	switch args[0] {
	case loopDriverCommand:
		return runLoopDriver(args[1:]), true
	case registrarCommand:
		return runRegistrar(args[1:]), true
	case fakeAgentCommand:
		return runFakeAgent(args[1:]), true
	}
	return 0, false
}

type stringList []string

func (s *stringList) String() string     { return fmt.Sprint(*s) }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func main() {
	// The demo runs the loop driver as a separate process: this binary, again.
	if code, ok := runSubcommand(os.Args[1:]); ok {
		os.Exit(code)
	}
	var o options
	fs := flag.NewFlagSet("nodeagent", flag.ExitOnError)
	fs.BoolVar(&o.demo, "demo", false, "run the embedded demo: fake API server, the loop CSI driver, pods mounted and unmounted")
	fs.IntVar(&o.pods, "pods", 5, "demo: number of pods")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster config)")
	fs.StringVar(&o.node, "node", "", "this node's name (default: the host name)")
	fs.StringVar(&o.rootDir, "root-dir", "", "kubelet root directory (default /var/lib/kubelet; the demo uses a temporary one)")
	fs.Var(&o.drivers, "driver", "a CSI driver as name=/path/to/csi.sock (repeatable)")
	fs.BoolVar(&o.registration, "plugin-registration", true, "register the CSI drivers whose registrars announce them in {root-dir}/plugins_registry")
	fs.BoolVar(&o.reportInUse, "report-volumes-in-use", true, "keep the Node's status.volumesInUse up to date, as the kubelet does (turn off when something else reports it)")
	fs.BoolVar(&o.nodeRestricted, "node-restricted", false, "read PVCs, PVs and VolumeAttachments one at a time with GET instead of informers: needed with the node's own credentials (Node authorizer), which may not list them")
	fs.BoolVar(&o.selfAttach, "self-attach", false, "attach volumes from the node (create and delete their VolumeAttachments), as the kubelet with --enable-controller-attach-detach=false; the Node's controller-managed-attach-detach annotation is removed")
	klog.InitFlags(fs)
	_ = fs.Parse(os.Args[1:])
	if o.node == "" {
		o.node, _ = os.Hostname()
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background())
	var err error
	if o.demo {
		err = runDemo(ctx, o)
	} else {
		if o.rootDir == "" {
			o.rootDir = "/var/lib/kubelet"
		}
		err = runAgent(ctx, o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "nodeagent:", err)
		os.Exit(1)
	}
}
