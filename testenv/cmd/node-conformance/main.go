// Command node-conformance runs Kubernetes' node e2e suite (e2e_node.test,
// built from k8s.io/kubernetes v1.37.2 by make conformance-bins) against
// one kubelet on this machine, as upstream runs it against a kubelet it
// ships, and writes the suite's ginkgo JSON report:
//
//	node-conformance -kubelet bin/kubelet -name fork -bin-dir ~/.cache/nodevol-conformance/v1.37.2 \
//		-out /tmp/node-conformance -suite storage [-focus re] [-skip re] [-procs 4]
//
// A suite (suites.go) names the specs; -focus and -skip, when given,
// replace its regular expressions.
//
// The node is real (package realnode): containerd and runc with images
// built here (busybox, pause, agnhost) under the names the suite uses, so
// nothing is pulled, in a network namespace made for the run, with a veth
// pair whose node end is the node's address (the suite's API server will
// not proxy to a loopback node address). The suite runs in that namespace
// with its in-process API server and starts the kubelet itself, with the
// root directory it assumes (/var/lib/kubelet: the run refuses to start if
// it is in use, and removes it afterwards).
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

	"github.com/nodevol/nodevol/testenv/realnode"
	"golang.org/x/sys/unix"
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

// kubeletRoot is the root directory the suite gives the kubelet and reads
// in some specs, whatever the kubelet's flags say.
const kubeletRoot = "/var/lib/kubelet"

// options are the command's flags.
type options struct {
	kubelet, name, binDir, out string
	focus, skip, labelFilter   string
	procs                      int
	timeout                    time.Duration
	kubeletFlags               string
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
	if o.focus == "" {
		o.focus = s.focus
	}
	if o.skip == "" {
		o.skip = s.skip
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
	if err := checkRootFree(); err != nil {
		return err
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
	var undo []func() error
	defer func() {
		for i := len(undo) - 1; i >= 0; i-- {
			err = errors.Join(err, undo[i]())
		}
	}()
	undo = append(undo, func() error { return os.RemoveAll(work) })

	ns, err := realnode.NewNetNS(ctx, realnode.NetNSOptions{Name: netnsName, HostAddr: hostAddr, NodeAddr: nodeAddr})
	if err != nil {
		return err
	}
	undo = append(undo, func() error { return ns.Delete(context.WithoutCancel(ctx)) })

	images, err := suiteImages(ctx, o.binDir, work)
	if err != nil {
		return err
	}
	rt, err := realnode.Start(ctx, realnode.Options{Dir: filepath.Join(work, "rt"), NetNS: ns.Path, PodSubnet: podSubnet, Images: images})
	if err != nil {
		return err
	}
	logs := filepath.Join(o.out, o.name+"-logs")
	undo = append(undo, func() error {
		_ = os.MkdirAll(logs, 0o755)
		_ = copyFile(rt.Log(), filepath.Join(logs, "containerd.log"))
		return rt.Stop(context.WithoutCancel(ctx))
	})
	undo = append(undo, func() error { return cleanKubelet(filepath.Join(work, "bin"), filepath.Join(work, "units")) })
	if err := shareRoot(); err != nil {
		return err
	}

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

// checkRootFree refuses a run while the kubelet's default root directory
// holds anything: it belongs to a kubelet of this machine, which the run
// would take over and then remove.
// A kubelet's device plugin socket is {kubeletRoot}/device-plugins/kubelet.sock
// whatever its root directory, so a kubelet run elsewhere (a test's) leaves
// that directory alone here: it is not taken as a sign of use.
func checkRootFree() error {
	entries, err := os.ReadDir(kubeletRoot)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	var names []string
	for _, e := range entries {
		if e.Name() != "device-plugins" {
			names = append(names, e.Name())
		}
	}
	if len(names) == 0 {
		return nil
	}
	return fmt.Errorf("%s is in use (%v): a node conformance run gives the kubelet that root and removes it afterwards; stop the machine's kubelet and move it away first", kubeletRoot, names)
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
	for _, d := range []string{runDir, binDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	// The suite starts the binary named kubelet in the directory it was
	// started from (os.Args[0]'s, links unresolved).
	for name, target := range map[string]string{"kubelet": o.kubelet, "e2e_node.test": filepath.Join(o.binDir, "e2e_node.test")} {
		if err := os.Symlink(target, filepath.Join(binDir, name)); err != nil {
			return nil, err
		}
	}
	pathDir := filepath.Join(work, "path")
	path, err := pathWithout(pathDir, "systemd-run", "systemctl", "sudo", "journalctl")
	if err != nil {
		return nil, err
	}
	fake := filepath.Join(work, "fakesystemd")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", fake, "github.com/nodevol/nodevol/testenv/cmd/fakesystemd").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building fakesystemd: %w\n%s", err, out)
	}
	for _, name := range []string{"systemd-run", "systemctl", "sudo"} {
		if err := os.Symlink(fake, filepath.Join(pathDir, name)); err != nil {
			return nil, err
		}
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
	ginkgo := []string{filepath.Join(o.binDir, "ginkgo"), "--procs", fmt.Sprint(o.procs), "--timeout", o.timeout.String(),
		"--no-color", "--output-dir", o.out, "--json-report", o.name + ".json", "--focus", o.focus}
	if o.skip != "" {
		ginkgo = append(ginkgo, "--skip", o.skip)
	}
	if o.labelFilter != "" {
		ginkgo = append(ginkgo, "--label-filter", o.labelFilter)
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

// pathWithout makes dir a directory of links to every command of this
// machine's PATH but the ones named, and returns it as a PATH.
func pathWithout(dir string, names ...string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	seen := map[string]bool{}
	for _, n := range names {
		seen[n] = true
	}
	for _, d := range filepath.SplitList(os.Getenv("PATH")) {
		entries, err := os.ReadDir(d)
		if err != nil {
			continue
		}
		for _, e := range entries {
			if seen[e.Name()] {
				continue
			}
			seen[e.Name()] = true
			if err := os.Symlink(filepath.Join(d, e.Name()), filepath.Join(dir, e.Name())); err != nil {
				return "", err
			}
		}
	}
	return dir, nil
}

// shareRoot makes the kubelet's root directory a shared mount of itself,
// as the kubelet does at its first start on a node (hostutil's
// MakeRShared) and as it stays on a node the kubelet has run on. A kubelet
// that makes that mount itself races its own pod resources server, which
// creates its socket in the root meanwhile: the socket's rename then
// crosses the new mount, fails with EXDEV, and the kubelet exits (seen
// here with the stock kubelet v1.37.2, at random).
func shareRoot() error {
	if err := os.MkdirAll(kubeletRoot, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(kubeletRoot, kubeletRoot, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mounting %s onto itself: %w", kubeletRoot, err)
	}
	if err := unix.Mount("", kubeletRoot, "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("making %s a shared mount: %w", kubeletRoot, err)
	}
	return nil
}

// cleanKubelet kills the suite's processes, the kubelet it started and
// fakesystemd's supervisor if they are still running (an interrupted run:
// found by their binaries' paths, in binDir, and the supervisor's units
// directory), then unmounts what is left below the kubelet's
// root directory and removes it: a kubelet leaves its root bind-mounted
// onto itself, and a spec that failed may leave a pod's volumes.
func cleanKubelet(binDir, unitsDir string) error {
	var errs []error
	if pids := append(realnode.ProcessesNaming(binDir), realnode.ProcessesNaming(unitsDir)...); len(pids) > 0 {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		errs = append(errs, fmt.Errorf("processes left by the suite, killed: %v", pids))
	}
	// The suite stops the kubelet as soon as its last spec ends, while the
	// namespaces of the last specs are still being deleted: their pods'
	// volumes may still be mounted then, on either kubelet. Logged, not an
	// error; Unmount fails if any cannot be unmounted.
	if ms, err := realnode.MountsUnder(kubeletRoot); err == nil {
		for _, m := range ms {
			if m.Point != kubeletRoot {
				log.Printf("left mounted when the suite stopped the kubelet, unmounting: %s (%s)", m.Point, m.FSType)
			}
		}
	}
	if err := realnode.Unmount(kubeletRoot); err != nil {
		return errors.Join(append(errs, err)...)
	}
	return errors.Join(append(errs, os.RemoveAll(kubeletRoot))...)
}

func copyFile(from, to string) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, data, 0o644)
}
