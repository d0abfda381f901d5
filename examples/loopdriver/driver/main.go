package driver

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"k8s.io/klog/v2"
)

// faultFlags collects repeated --fault flags.
type faultFlags []fault

func (f *faultFlags) String() string {
	var s []string
	for _, ft := range *f {
		s = append(s, ft.String())
	}
	return strings.Join(s, " ")
}

func (f *faultFlags) Set(v string) error {
	ft, err := parseFault(v)
	if err != nil {
		return err
	}
	*f = append(*f, ft)
	return nil
}

// Main parses the command-line flags in args (without the program name),
// runs the driver until SIGTERM or SIGINT, and returns the process exit
// code: 0 after a clean stop, 1 if the driver failed, 2 for bad flags.
// Another program can embed the driver as a hidden subcommand with
// os.Exit(driver.Main(os.Args[2:])).
func Main(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return mainContext(ctx, args, os.Stderr)
}

// mainContext is Main with the context that stops the driver and the
// writer for usage errors given by the caller.
func mainContext(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("loopdriver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg      options
		endpoint string
		faults   faultFlags
		callLog  string
	)
	fs.StringVar(&endpoint, "endpoint", "unix:///run/csi/loop.sock", "CSI endpoint: unix:///path/to.sock or a plain socket path")
	fs.StringVar(&cfg.NodeID, "nodeid", "", "node ID reported by NodeGetInfo (default: the host name)")
	fs.StringVar(&cfg.DriverName, "drivername", DefaultDriverName, "CSI driver name")
	fs.StringVar(&cfg.StateDir, "statedir", "/var/lib/loopdriver", "directory for volume images and state")
	fs.Int64Var(&cfg.MaxVolumes, "max-volumes", defaultMaxVolumes, "max_volumes_per_node reported by NodeGetInfo and enforced by ControllerPublishVolume")
	fs.Var(&faults, "fault", "inject a fault, METHOD[/VOLUMEID]:ACTION[,ACTION...] with ACTION delay=DURATION, error=CODE, exit, at=start|mid, times=N (repeatable)")
	fs.StringVar(&callLog, "call-log", "", "append one line per Node service RPC (method, volume ID, target path, staging path; tab-separated) to this file, for tests")
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	klogFlags.VisitAll(func(f *flag.Flag) { fs.Var(f.Value, f.Name, f.Usage) })
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "loopdriver: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if cfg.NodeID == "" {
		host, err := os.Hostname()
		if err != nil {
			fmt.Fprintf(stderr, "loopdriver: --nodeid not given and no host name: %v\n", err)
			return 2
		}
		cfg.NodeID = host
	}
	cfg.Faults = faults
	if callLog != "" {
		f, err := os.OpenFile(callLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
		if err != nil {
			fmt.Fprintf(stderr, "loopdriver: --call-log: %v\n", err)
			return 2
		}
		defer f.Close()
		cfg.CallLog = f
	}
	defer klog.Flush()
	logger := klog.Background().WithName("loopdriver")
	ctx = klog.NewContext(ctx, logger)
	d, err := newServer(cfg)
	if err != nil {
		logger.Error(err, "Cannot start")
		return 1
	}
	if len(faults) > 0 {
		logger.Info("Fault injection enabled", "faults", faults.String())
	}
	if err := d.run(ctx, endpoint); err != nil {
		logger.Error(err, "Driver failed")
		return 1
	}
	logger.Info("Stopped")
	return 0
}
