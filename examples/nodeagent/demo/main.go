// Command demo is nodevol's demo: an in-memory API server, the loop CSI
// driver (real ext4 volumes on loop devices as root; the test kit's
// in-process driver and a fake mounter otherwise), a few pods mounted,
// written to, read back and unmounted. `make demo` runs it.
//
//	go run ./examples/nodeagent/demo [--pods 5] [--node node-1] [--root-dir DIR]
//
// It is a command of its own, apart from the production node agent
// (examples/nodeagent), because it links the fake clientset, the loop
// driver and the test kit. Its hidden subcommands run the loop driver, a
// registrar and agent-fake (the node agent on a fake API server) as
// separate processes of this binary, for the demo and for the end-to-end
// tests of this directory.
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
	pods    int
	node    string
	rootDir string
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

func main() {
	// The demo runs the loop driver as a separate process: this binary, again.
	if code, ok := runSubcommand(os.Args[1:]); ok {
		os.Exit(code)
	}
	var o options
	fs := flag.NewFlagSet("demo", flag.ExitOnError)
	fs.IntVar(&o.pods, "pods", 5, "number of pods")
	fs.StringVar(&o.node, "node", "", "the node's name (default: the host name)")
	fs.StringVar(&o.rootDir, "root-dir", "", "kubelet-style root directory (default: a temporary one, removed at the end)")
	klog.InitFlags(fs)
	_ = fs.Parse(os.Args[1:])
	if o.node == "" {
		o.node, _ = os.Hostname()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background())
	if err := runDemo(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "nodevol demo:", err)
		os.Exit(1)
	}
}
