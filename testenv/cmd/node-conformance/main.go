// Command node-conformance runs Kubernetes' node e2e suite (e2e_node.test,
// built from k8s.io/kubernetes v1.37.2 by make conformance-bins) against
// one kubelet on this machine, as upstream runs it against a kubelet it
// ships, and writes the suite's ginkgo JSON report:
//
//	node-conformance -kubelet bin/kubelet -name fork -bin-dir ~/.cache/nodevol-conformance/v1.37.2 \
//		-out /tmp/node-conformance -suite storage [-focus re] [-skip re] [-procs 4] \
//		[-shard K/N | -rerun-failed earlier.json,...]
//
// A suite (suites.go) names the specs; -focus and -skip, when given,
// replace its regular expressions. -shard runs a part of them (shard.go);
// -rerun-failed only those that failed in earlier reports of the side.
//
// The node is real (package realnode): containerd and runc with images
// built here (busybox, pause, agnhost, nginx, ...) under the names the
// suite uses, served as the node's only registry, so nothing is pulled
// from outside, in a network namespace made for the run, with a veth
// pair whose node end is the node's address (the suite's API server will
// not proxy to a loopback node address), and a mount namespace of its own
// (the run runs itself again in one), where a directory of the run's is
// the kubelet's root at the path the suite assumes, /var/lib/kubelet. The
// suite runs there with its in-process API server and starts the kubelet
// itself.
//
// It writes {out}/{name}.json (the report), {out}/{name}.log (ginkgo's
// output) and {out}/{name}-logs/ (the kubelet's and containerd's logs and
// the suite's other files),
// and exits 0 once the report is written, whatever the specs' outcomes:
// conformance-report compares two runs. It exits 1 when the run could not
// be made or left something behind.
package main

import (
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nodevol/nodevol/internal/realnode"
	"github.com/nodevol/nodevol/testenv/internal/noderun"
)

// baseKubeletConfig is the base KubeletConfiguration the suite starts
// from (--kubelet-config-file).
//
//go:embed kubelet.yaml
var baseKubeletConfig []byte

// The node's network: the pair's addresses, and the pods' subnet (the
// base configuration's podCIDR) on a bridge inside the node's namespace.
const (
	netnsName = "nodevol-conf"
	podSubnet = "10.100.0.0/24"
)

var (
	hostAddr = netip.MustParsePrefix("10.230.0.1/30")
	nodeAddr = netip.MustParsePrefix("10.230.0.2/30")
)

// options are the command's flags.
type options struct {
	kubelet, name, binDir, out string
	focus, skip, labelFilter   string
	procs                      int
	timeout                    time.Duration
	kubeletFlags               string
	shard                      shard
	// rerun are the places of the specs that failed in earlier reports of
	// this side (-rerun-failed): only those run.
	rerun []place
}

func main() {
	var o options
	flag.StringVar(&o.kubelet, "kubelet", "", "the kubelet binary to judge (required)")
	flag.StringVar(&o.name, "name", "", "the run's name, for its files: stock or fork (required)")
	flag.StringVar(&o.binDir, "bin-dir", "", "directory of e2e_node.test, ginkgo and agnhost (make conformance-bins; required)")
	flag.StringVar(&o.out, "out", "", "directory for the report and logs (required)")
	suiteName := flag.String("suite", "storage", fmt.Sprintf("the specs to run: one of %v", suiteNames()))
	flag.StringVar(&o.focus, "focus", "", "ginkgo --focus (default: the suite's)")
	flag.StringVar(&o.skip, "skip", "", "ginkgo --skip (default: the suite's)")
	flag.StringVar(&o.labelFilter, "label-filter", "", "ginkgo --label-filter")
	flag.IntVar(&o.procs, "procs", 4, "ginkgo processes (parallel specs; serial specs run alone)")
	flag.DurationVar(&o.timeout, "timeout", 3*time.Hour, "the suite's time limit")
	flag.StringVar(&o.kubeletFlags, "kubelet-flags", "", "more kubelet flags, after the run's own")
	shardFlag := flag.String("shard", "", "run part K/N of the suite's specs (split by their place in the suite's source); conformance-report takes the parts' reports together")
	rerunFlag := flag.String("rerun-failed", "", "comma-separated ginkgo JSON reports of earlier runs of this side: run only the suite's specs that failed in them (conformance-report takes a rerun's report after theirs)")
	flag.Parse()
	if o.kubelet == "" || o.name == "" || o.binDir == "" || o.out == "" || flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	s, err := lookupSuite(*suiteName)
	if err != nil {
		log.Print(err)
		os.Exit(2)
	}
	if o.shard, err = parseShard(*shardFlag); err != nil {
		log.Print(err)
		os.Exit(2)
	}
	if *rerunFlag != "" && o.shard.n > 0 {
		log.Print("-rerun-failed and -shard: give one")
		os.Exit(2)
	}
	if o.focus == "" {
		o.focus = s.focus
	}
	if o.skip == "" {
		o.skip = s.skip
	}
	if !noderun.InNamespaces() {
		os.Exit(noderun.Reexec("", false))
	}
	// Read once, in the mount namespace's run.
	if *rerunFlag != "" {
		if o.rerun, err = failedPlaces(strings.Split(*rerunFlag, ",")); err != nil {
			log.Print(err)
			os.Exit(2)
		}
		if len(o.rerun) == 0 {
			// Nothing to rerun: no report, and none of an earlier rerun.
			log.Printf("node-conformance %s: no spec failed in %s: nothing to rerun", o.name, *rerunFlag)
			if err := os.Remove(filepath.Join(o.out, o.name+".json")); err != nil && !os.IsNotExist(err) {
				log.Print(err)
				os.Exit(1)
			}
			os.Exit(0)
		}
		log.Printf("node-conformance %s: rerunning the specs of the %d places that failed in %s", o.name, len(o.rerun), *rerunFlag)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		log.Printf("node-conformance %s: %v", o.name, err)
		os.Exit(1)
	}
}

// run makes the node, runs the suite on it and takes the node down.
func run(ctx context.Context, o options) (err error) {
	if os.Geteuid() != 0 {
		return errors.New("a node conformance run needs root")
	}
	if m := realnode.Missing(); m != "" {
		return fmt.Errorf("this machine lacks the packages %s (make deps installs them as root)", m)
	}
	for _, p := range []*string{&o.kubelet, &o.binDir, &o.out} {
		if *p, err = filepath.Abs(*p); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "nc-")
	if err != nil {
		return err
	}
	// Everything made below is taken down in reverse, whatever happened;
	// what could not be is the run's error.
	var undo noderun.Undo
	defer func() { err = errors.Join(err, undo.Run()) }()
	undo.Add(func() error { return noderun.RemoveWork(work) })

	// A run killed before its clean-up, or a machine restarted under one,
	// leaves the namespace's name behind: the name is the runner's own and
	// a network namespace holds no data.
	if found, err := realnode.DeleteNetNS(ctx, netnsName); err != nil {
		return fmt.Errorf("removing the network namespace %s an earlier run left: %w", netnsName, err)
	} else if found {
		log.Printf("node-conformance %s: removed the network namespace %s an earlier run left", o.name, netnsName)
	}
	ns, err := realnode.NewNetNS(ctx, realnode.NetNSOptions{Name: netnsName, HostAddr: hostAddr, NodeAddr: nodeAddr})
	if err != nil {
		return err
	}
	undo.Add(func() error { return ns.Delete(context.WithoutCancel(ctx)) })

	images, err := noderun.SuiteImages(ctx, o.binDir, work)
	if err != nil {
		return err
	}
	logs := filepath.Join(o.out, o.name+"-logs")
	rt, err := noderun.StartNode(ctx, noderun.NodeOptions{Work: work, Logs: logs, Images: images,
		RegistryAddr: hostAddr.Addr(), NetNS: ns.Path, PodSubnet: podSubnet}, &undo)
	if err != nil {
		return err
	}
	undo.Add(func() error { return noderun.KillProcesses(filepath.Join(work, "bin"), filepath.Join(work, "units")) })

	cmd, err := suiteCommand(ctx, o, work, logs, ns, rt.Endpoint)
	if err != nil {
		return err
	}
	start := time.Now()
	log.Printf("node-conformance %s: running %s", o.name, strings.Join(cmd.Args, " "))
	runErr := cmd.Run()
	log.Printf("node-conformance %s: the suite ran for %v (%v)", o.name, time.Since(start).Round(time.Second), runErr)
	if _, err := os.Stat(filepath.Join(o.out, o.name+".json")); err != nil {
		return fmt.Errorf("the suite wrote no report (%v): %w", runErr, err)
	}
	return nil
}

// suiteCommand is ginkgo running e2e_node.test in the node's network
// namespace, in {work}/run, with a PATH whose systemd-run, systemctl and
// sudo are fakesystemd's (testenv/cmd/fakesystemd), over {work}/units:
// this machine has systemd's commands but no systemd, and no sudo, and
// the suite starts, stops and restarts the kubelet only through them.
// journalctl is left out too: with no journal, the suite copies the log
// files instead.
func suiteCommand(ctx context.Context, o options, work, logs string, ns *realnode.NetNS, endpoint string) (*exec.Cmd, error) {
	runDir, binDir := filepath.Join(work, "run"), filepath.Join(work, "bin")
	path, err := suiteFiles(ctx, o, work, runDir, binDir)
	if err != nil {
		return nil, err
	}
	config := filepath.Join(work, "kubelet-base.yaml")
	if err := os.WriteFile(config, baseKubeletConfig, 0o644); err != nil {
		return nil, err
	}
	// The suite re-encodes the configuration, which drops an empty
	// enforceNodeAllocatable, and sets cgroups of its own for the kubelet
	// and the system ("/system" would take every process of the machine):
	// flags, which come after its own, keep them empty.
	kubeletFlags := "--enforce-node-allocatable= --system-cgroups= --kubelet-cgroups= --runtime-cgroups= --node-ip=" + ns.NodeAddr.Addr().String()
	if o.kubeletFlags != "" {
		kubeletFlags += " " + o.kubeletFlags
	}
	ginkgo, err := ginkgoArgs(ctx, o)
	if err != nil {
		return nil, err
	}
	ginkgo = append(ginkgo, filepath.Join(binDir, "e2e_node.test"), "--",
		"--prepull-images=false",
		"--container-runtime-endpoint="+endpoint,
		"--image-service-endpoint="+endpoint,
		"--kubelet-config-file="+config,
		"--kubelet-flags="+kubeletFlags,
		// The kubelet's log and the suite's own files.
		"--report-dir="+logs,
	)
	args := realnode.InNetNS(ns.Path, ginkgo)
	out, err := os.Create(filepath.Join(o.out, o.name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Dir = runDir
	cmd.Env = append(os.Environ(), "PATH="+path, "NODEVOL_UNITS_DIR="+filepath.Join(work, "units"))
	cmd.Stdout, cmd.Stderr = io.MultiWriter(out, os.Stdout), io.MultiWriter(out, os.Stderr)
	// Interrupted, ginkgo gets SIGINT (it reports and stops its
	// processes, which stop the kubelet) and SIGKILL a minute later.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = time.Minute
	return cmd, nil
}

// suiteFiles makes what the suite runs from: its run directory, the
// directory of the binaries it starts and a PATH whose systemd commands are
// fakesystemd's; it returns that PATH.
func suiteFiles(ctx context.Context, o options, work, runDir, binDir string) (string, error) {
	for _, d := range []string{runDir, binDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", err
		}
	}
	// The suite starts the binary named kubelet in the directory it was
	// started from (os.Args[0]'s, links unresolved).
	for name, target := range map[string]string{"kubelet": o.kubelet, "e2e_node.test": filepath.Join(o.binDir, "e2e_node.test")} {
		if err := os.Symlink(target, filepath.Join(binDir, name)); err != nil {
			return "", err
		}
	}
	pathDir := filepath.Join(work, "path")
	path, err := noderun.PathWithout(pathDir, "systemd-run", "systemctl", "sudo", "journalctl")
	if err != nil {
		return "", err
	}
	fake := filepath.Join(work, "fakesystemd")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", fake, "github.com/nodevol/nodevol/testenv/cmd/fakesystemd").CombinedOutput(); err != nil {
		return "", fmt.Errorf("building fakesystemd: %w\n%s", err, out)
	}
	for _, name := range []string{"systemd-run", "systemctl", "sudo"} {
		if err := os.Symlink(fake, filepath.Join(pathDir, name)); err != nil {
			return "", err
		}
	}
	return path, nil
}

// ginkgoArgs is the ginkgo command line up to the suite's binary: the
// options' processes, timeout, report, focus and skip, and the focus on
// the shard's or the rerun's spec places.
func ginkgoArgs(ctx context.Context, o options) ([]string, error) {
	ginkgo := []string{filepath.Join(o.binDir, "ginkgo"), "--procs", fmt.Sprint(o.procs), "--timeout", o.timeout.String(),
		"--no-color", "--output-dir", o.out, "--json-report", o.name + ".json", "--focus", o.focus}
	if o.skip != "" {
		ginkgo = append(ginkgo, "--skip", o.skip)
	}
	if o.labelFilter != "" {
		ginkgo = append(ginkgo, "--label-filter", o.labelFilter)
	}
	if o.shard.n > 0 {
		places, err := specPlaces(ctx, filepath.Join(o.binDir, "e2e_node.test"), o.focus, o.skip)
		if err != nil {
			return nil, err
		}
		mine := shardPlaces(places, o.shard)
		if len(mine) == 0 {
			return nil, fmt.Errorf("shard %d/%d holds no spec of the %d places", o.shard.k, o.shard.n, len(places))
		}
		ginkgo = append(ginkgo, focusFiles(mine)...)
	}
	return append(ginkgo, focusFiles(o.rerun)...), nil
}
