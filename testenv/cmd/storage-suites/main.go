// Command storage-suites runs the [sig-storage] testsuites of Kubernetes'
// cluster e2e suite (e2e.test, built from k8s.io/kubernetes v1.37.2 by make
// storage-suites-bins) against a one-node cluster made on this machine
// around one kubelet, as upstream certifies a volume plugin, and writes
// the suite's ginkgo JSON report:
//
//	storage-suites -kubelet bin/kubelet -name fork -bin-dir ~/.cache/nodevol-conformance/v1.37.2 \
//		-out /tmp/storage-suites [-set default] [-focus re] [-skip re] [-procs 4]
//
// The cluster: testenv's etcd and kube-apiserver (Node and RBAC
// authorization, the ServiceAccount and NodeRestriction admission plugins),
// kube-controller-manager with every default controller, kube-scheduler,
// all v1.37.2, and the kubelet judged, on a real node (package realnode:
// containerd and runc, the images upstream's suites run built here under
// their names, nothing ever pulled from outside). The kubernetes Service's
// address reaches the API server from the pods through one DNAT rule, in
// place of kube-proxy: the suites' pods use no other Service.
//
// Everything runs in namespaces of the run's own: a network namespace with
// a veth pair (the node's address is the pair's node end: the API server
// will not proxy to a loopback node address, and exec and logs go through
// it), nothing added to the host's interfaces, no route out; a mount
// namespace, where a directory of the run's is the kubelet's root at
// /var/lib/kubelet, the path the suites assume; and a PID namespace, so
// that the suites' host-exec pods, which enter "the host's" mount
// namespace through /proc/1/ns/mnt to make local volumes' directories,
// mounts and loop devices, enter the run's.
//
// It writes {out}/{name}.json (the report), {out}/{name}.log (ginkgo's
// output) and {out}/{name}-logs/ (the components' and containerd's logs),
// and exits 0 once the report is written, whatever the specs' outcomes:
// conformance-report compares two runs. It exits 1 when the run could not
// be made or left something behind.
package main

import (
	"context"
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
	"slices"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/nodevol/nodevol/internal/realnode"
	"github.com/nodevol/nodevol/testenv"
	"github.com/nodevol/nodevol/testenv/internal/noderun"
)

// The node's network: the pair's addresses, and the pods' subnet on a
// bridge inside the node's namespace; the node's name.
const (
	netnsName = "nodevol-sto"
	podSubnet = "10.101.0.0/24"
	nodeName  = "storage-node"
)

var (
	hostAddr = netip.MustParsePrefix("10.231.0.1/30")
	nodeAddr = netip.MustParsePrefix("10.231.0.2/30")
)

// hostpathDataDir is where csi-driver-host-path's manifests keep its
// volumes on the node.
const hostpathDataDir = "/var/lib/csi-hostpath-data"

// kubernetesService is the kubernetes Service's address and port in
// testenv's service range (10.0.0.0/24): in-cluster clients connect there.
const kubernetesService = "10.0.0.1:443"

// options are the command's flags.
type options struct {
	kubelet, name, binDir, testenvDir, out string
	focus, skip                            string
	hostpathPlugin                         string
	procs                                  int
	timeout                                time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.kubelet, "kubelet", "", "the kubelet binary to judge (required)")
	flag.StringVar(&o.name, "name", "", "the run's name, for its files: stock or fork (required)")
	flag.StringVar(&o.binDir, "bin-dir", "", "directory of e2e.test, ginkgo, kube-controller-manager, kube-scheduler, kubectl and the images' binaries (make storage-suites-bins; required)")
	flag.StringVar(&o.testenvDir, "testenv-dir", "", "directory of kube-apiserver and etcd (make testenv-bins; default testenv's)")
	flag.StringVar(&o.out, "out", "", "directory for the report and logs (required)")
	setName := flag.String("set", "default", "the specs to run: default, csi-mock, csi-hostpath, csi-hostpath-slow or all")
	flag.StringVar(&o.hostpathPlugin, "hostpathplugin", "", "csi-driver-host-path's hostpathplugin v1.17.1, which the hostpath image runs (the csi-hostpath set needs it; without it the image plays the CSI mock driver alone)")
	flag.StringVar(&o.focus, "focus", "", "ginkgo --focus (default: the set's)")
	flag.StringVar(&o.skip, "skip", "", "ginkgo --skip (default: the set's)")
	flag.IntVar(&o.procs, "procs", 4, "ginkgo processes (parallel specs; serial specs run alone)")
	flag.DurationVar(&o.timeout, "timeout", 3*time.Hour, "the suite's time limit")
	flag.Parse()
	if o.kubelet == "" || o.name == "" || o.binDir == "" || o.out == "" || flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	set, err := lookupSet(*setName)
	if err != nil {
		log.Print(err)
		os.Exit(2)
	}
	if set.needsHostpath && o.hostpathPlugin == "" {
		log.Printf("the %s set runs csi-driver-host-path's driver: -hostpathplugin names its hostpathplugin v1.17.1 (no module proxy serves it, and the project builds none of its code)", set.name)
		os.Exit(2)
	}
	if o.focus == "" {
		o.focus = set.focus
	}
	if o.skip == "" {
		o.skip = set.skip
	}
	if !noderun.InNamespaces() {
		os.Exit(outside())
	}
	if code, ok := noderun.RunAsInit(); ok {
		os.Exit(code)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		log.Printf("storage-suites %s: %v", o.name, err)
		os.Exit(1)
	}
}

// outside makes the node's network namespace, runs this command again in
// it and in mount and PID namespaces of its own, removes the namespace
// and returns the run's exit code.
func outside() int {
	if os.Geteuid() != 0 {
		log.Print("a storage suites run needs root")
		return 1
	}
	if m := realnode.Missing(); m != "" {
		log.Printf("this machine lacks the packages %s (make deps installs them as root)", m)
		return 1
	}
	ctx := context.Background()
	// A run killed before its clean-up leaves the namespace's name
	// behind: the name is the runner's own and a network namespace holds
	// no data.
	if found, err := realnode.DeleteNetNS(ctx, netnsName); err != nil {
		log.Printf("removing the network namespace %s an earlier run left: %v", netnsName, err)
		return 1
	} else if found {
		log.Printf("removed the network namespace %s an earlier run left", netnsName)
	}
	ns, err := realnode.NewNetNS(ctx, realnode.NetNSOptions{Name: netnsName, HostAddr: hostAddr, NodeAddr: nodeAddr})
	if err != nil {
		log.Print(err)
		return 1
	}
	code := noderun.Reexec(ns.Path, true)
	if err := ns.Delete(ctx); err != nil {
		log.Print(err)
		return 1
	}
	return code
}

// run makes the cluster, runs the suite on it and takes it down.
func run(ctx context.Context, o options) (err error) {
	if err := o.absPaths(); err != nil {
		return err
	}
	logs := filepath.Join(o.out, o.name+"-logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "ss-")
	if err != nil {
		return err
	}
	// Everything made below is taken down in reverse, whatever happened;
	// what could not be is the run's error.
	var undo noderun.Undo
	defer func() { err = errors.Join(err, undo.Run()) }()
	undo.Add(func() error { return noderun.RemoveWork(work) })

	endpoint, err := startNode(ctx, o, work, logs, &undo)
	if err != nil {
		return err
	}
	env, admin, err := startAPIServer(ctx, o, work, &undo)
	if err != nil {
		return err
	}
	client, err := startComponents(ctx, o, env, endpoint, work, admin, logs, &undo)
	if err != nil {
		return err
	}
	if err := prepareCluster(ctx, o, client, admin, &undo); err != nil {
		return err
	}
	return runSuite(ctx, o, admin, logs)
}

// absPaths makes the options' paths absolute: the suite runs in a
// directory of its own.
func (o *options) absPaths() (err error) {
	paths := []*string{&o.kubelet, &o.binDir, &o.out}
	if o.hostpathPlugin != "" {
		paths = append(paths, &o.hostpathPlugin)
	}
	for _, p := range paths {
		if *p, err = filepath.Abs(*p); err != nil {
			return err
		}
	}
	return nil
}

// startNode starts the node's container runtime with the suites' images
// and the CSI drivers' (the run is in the node's network namespace
// already), returning the runtime's endpoint.
func startNode(ctx context.Context, o options, work, logs string, undo *noderun.Undo) (string, error) {
	images, err := noderun.SuiteImages(ctx, o.binDir, work)
	if err != nil {
		return "", err
	}
	i := slices.IndexFunc(images, func(img realnode.Image) bool { return img.Name == realnode.BusyboxImage })
	if i < 0 {
		return "", errors.New("the suite images have no busybox")
	}
	csi, err := csiDriverImages(ctx, o.binDir, work, images[i], o.hostpathPlugin)
	if err != nil {
		return "", err
	}
	images = append(images, csi...)
	rt, err := noderun.StartNode(ctx, noderun.NodeOptions{Work: work, Logs: logs, Images: images,
		RegistryAddr: nodeAddr.Addr(), PodSubnet: podSubnet}, undo)
	if err != nil {
		return "", err
	}
	// Where csi-driver-host-path's pods keep their volumes (a hostPath of
	// its manifests) is the run's; once its pods have gone (below), the
	// loop devices of block volumes a spec left are detached.
	hostpathData, undoData, err := noderun.DirIn(work, "csi-hostpath-data", hostpathDataDir)
	if err != nil {
		return "", err
	}
	undo.Add(undoData)
	undo.Add(func() error {
		detached, err := detachLoopsUnder(hostpathData)
		if len(detached) > 0 {
			log.Printf("storage-suites %s: left by csi-driver-host-path's block volumes, detached: %v", o.name, detached)
		}
		return err
	})
	return rt.Endpoint, nil
}

// startAPIServer starts testenv's API server and etcd, reachable at the
// node's address, returning them and the path of an admin kubeconfig.
func startAPIServer(ctx context.Context, o options, work string, undo *noderun.Undo) (*testenv.Env, string, error) {
	env, err := testenv.Start(ctx, testenv.Options{
		BinDir:                  o.testenvDir,
		AuthorizationModes:      []string{"Node", "RBAC"},
		EnableAdmissionPlugins:  []string{"NodeRestriction"},
		DisableAdmissionPlugins: []string{},
		// The API server reaches the node (exec, logs, the node proxy) at
		// its address, never its name, which no DNS here knows.
		APIServerArgs: []string{"--bind-address=0.0.0.0", "--advertise-address=" + nodeAddr.Addr().String(),
			"--kubelet-preferred-address-types=InternalIP"},
	})
	if err != nil {
		return nil, "", err
	}
	undo.Add(env.Stop)
	if err := serviceRoute(ctx, env.Port()); err != nil {
		return nil, "", err
	}
	admin := filepath.Join(work, "admin.kubeconfig")
	if err := env.WriteKubeconfig(admin, env.Config()); err != nil {
		return nil, "", err
	}
	return env, admin, nil
}

// startComponents starts the controller manager, the scheduler and the
// kubelet under test, and waits for the node to be ready.
func startComponents(ctx context.Context, o options, env *testenv.Env, endpoint, work, admin, logs string, undo *noderun.Undo) (kubernetes.Interface, error) {
	nodeCfg, err := env.NodeConfig(nodeName)
	if err != nil {
		return nil, err
	}
	nodeKubeconfig := filepath.Join(work, "node.kubeconfig")
	if err := env.WriteKubeconfig(nodeKubeconfig, nodeCfg); err != nil {
		return nil, err
	}
	var components []*process
	undo.Add(func() error {
		var errs []error
		for i := len(components) - 1; i >= 0; i-- {
			errs = append(errs, components[i].stop())
		}
		return errors.Join(errs...)
	})
	config := filepath.Join(work, "kubelet.yaml")
	if err := os.WriteFile(config, fmt.Appendf(nil, kubeletConfig, endpoint, podSubnet), 0o644); err != nil {
		return nil, err
	}
	for _, c := range []struct {
		name string
		argv []string
	}{
		{"kube-controller-manager", append([]string{filepath.Join(o.binDir, "kube-controller-manager")}, controllerManagerArgs(env, admin)...)},
		{"kube-scheduler", append([]string{filepath.Join(o.binDir, "kube-scheduler")}, schedulerArgs(admin)...)},
		{"kubelet", []string{o.kubelet, "--config=" + config, "--kubeconfig=" + nodeKubeconfig,
			"--hostname-override=" + nodeName, "--node-ip=" + nodeAddr.Addr().String(),
			"--root-dir=" + noderun.KubeletRoot, "--v=2"}},
	} {
		p, err := start(c.name, logs, c.argv)
		if err != nil {
			return nil, err
		}
		components = append(components, p)
	}
	client, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		return nil, err
	}
	if err := waitReady(ctx, client, nodeName, components...); err != nil {
		return nil, err
	}
	return client, nil
}

// prepareCluster installs what a cluster's add-ons would (the volume
// snapshot CRDs) and schedules the clean-up after the suite: every pod
// gone, then what the local volume specs left.
func prepareCluster(ctx context.Context, o options, client kubernetes.Interface, admin string, undo *noderun.Undo) error {
	// The volume snapshot CRDs, which a cluster's add-ons install and the
	// CSI drivers' snapshotter sidecar watches.
	apply := exec.CommandContext(ctx, filepath.Join(o.binDir, "kubectl"), "--kubeconfig="+admin, "apply", "-f", filepath.Join(o.binDir, "csi", "crd"))
	if out, err := apply.CombinedOutput(); err != nil {
		return fmt.Errorf("installing the volume snapshot CRDs: %w\n%s", err, out)
	}
	localBefore, err := localDriverDirs(localDriverGlob)
	if err != nil {
		return err
	}
	// Once the pods have gone (below), what the local volume specs left.
	undo.Add(func() error {
		cleaned, err := cleanLocalDriverLeftovers(localDriverGlob, localBefore)
		if len(cleaned) > 0 {
			log.Printf("storage-suites %s: left by the local volume specs, taken down: %v", o.name, cleaned)
		}
		return err
	})
	// After the suite, and before the kubelet stops, every pod goes. One
	// that does not is logged, not the run's failure: a spec that failed
	// can leave a pod the kubelet cannot finish (an inline volume whose
	// driver went with the spec), on either kubelet; the report judges
	// the specs, and what is left mounted is taken down below.
	undo.Add(func() error {
		if err := drain(context.WithoutCancel(ctx), client); err != nil {
			log.Printf("storage-suites %s: %v", o.name, err)
		}
		return nil
	})
	return nil
}

// runSuite runs the suite with ginkgo; a run that wrote no report is the
// run's error, failed specs are the report's.
func runSuite(ctx context.Context, o options, admin, logs string) error {
	cmd, err := suiteCommand(ctx, o, admin, logs)
	if err != nil {
		return err
	}
	started := time.Now()
	log.Printf("storage-suites %s: running %s", o.name, strings.Join(cmd.Args, " "))
	runErr := cmd.Run()
	log.Printf("storage-suites %s: the suite ran for %v (%v)", o.name, time.Since(started).Round(time.Second), runErr)
	if _, err := os.Stat(filepath.Join(o.out, o.name+".json")); err != nil {
		return fmt.Errorf("the suite wrote no report (%v): %w", runErr, err)
	}
	return nil
}

// serviceRoute sends what the node and its pods send to the kubernetes
// Service to the API server, on the node's address: kube-proxy's one rule
// the suites need, in the node's network namespace alone.
func serviceRoute(ctx context.Context, apiPort int) error {
	to := netip.AddrPortFrom(nodeAddr.Addr(), uint16(apiPort)).String()
	svc := netip.MustParseAddrPort(kubernetesService)
	for _, chain := range []string{"PREROUTING", "OUTPUT"} {
		args := []string{"-w", "-t", "nat", "-A", chain, "-d", svc.Addr().String() + "/32", "-p", "tcp",
			"--dport", fmt.Sprint(svc.Port()), "-j", "DNAT", "--to-destination", to}
		if out, err := exec.CommandContext(ctx, "iptables", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("iptables %s: %w: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// suiteCommand is ginkgo running e2e.test against the cluster.
func suiteCommand(ctx context.Context, o options, kubeconfig, logs string) (*exec.Cmd, error) {
	ginkgo := []string{filepath.Join(o.binDir, "ginkgo"), "--procs", fmt.Sprint(o.procs), "--timeout", o.timeout.String(),
		"--no-color", "--output-dir", o.out, "--json-report", o.name + ".json", "--focus", o.focus}
	if o.skip != "" {
		ginkgo = append(ginkgo, "--skip", o.skip)
	}
	ginkgo = append(ginkgo, filepath.Join(o.binDir, "e2e.test"), "--",
		"--kubeconfig="+kubeconfig,
		"--provider=skeleton",
		"--kubectl-path="+filepath.Join(o.binDir, "kubectl"),
		"--report-dir="+logs,
		"--disable-log-dump",
	)
	out, err := os.Create(filepath.Join(o.out, o.name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, ginkgo[0], ginkgo[1:]...)
	cmd.Dir = logs
	cmd.Stdout, cmd.Stderr = io.MultiWriter(out, os.Stdout), io.MultiWriter(out, os.Stderr)
	// Interrupted, ginkgo gets SIGINT (it reports and stops its
	// processes) and SIGKILL a minute later.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = time.Minute
	return cmd, nil
}
