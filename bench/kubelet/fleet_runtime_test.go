package kubeletbench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/internal/realnode"
)

// BenchmarkFleet's container runtimes (-fleet.runtime).
const (
	// fleetFake is the fake runtime (k8s.io/cri-client/pkg/fake, served by
	// the benchmark's process), one per node: no containers.
	fleetFake = "fake"
	// fleetContainerd is a real one (internal/realnode: containerd 1.6 and
	// runc), one per run: real containers of a busybox image built here.
	fleetContainerd = "containerd"
)

var fleetRuntime = flag.String("fleet.runtime", fleetFake, "BenchmarkFleet: the nodes' container runtime, "+
	"fake (the hollow node's, in the benchmark's process) or containerd (containerd and runc, real containers; one node only)")

// checkFleetRuntime checks the runtime asked for against the node counts:
// on containerd only one node, because a kubelet owns every container of
// its runtime (its garbage collector removes the sandboxes of pods it does
// not know), so two kubelets cannot share one containerd, and a containerd
// per node is more than this machine runs.
func checkFleetRuntime(runtime string, nodes []int) error {
	switch runtime {
	case fleetFake:
		return nil
	case fleetContainerd:
		for _, n := range nodes {
			if n != 1 {
				return fmt.Errorf("-fleet.runtime %s runs one node only (FLEET_NODES=1), not %d: "+
					"a kubelet removes the containers of pods it does not know, so nodes cannot share a containerd", runtime, n)
			}
		}
		return nil
	}
	return fmt.Errorf("-fleet.runtime %q: fake or containerd", runtime)
}

// fleetRuntimeOf is a saved run's runtime: runs saved before the runtime
// was recorded ran on the fake one.
func fleetRuntimeOf(saved string) string {
	if saved == "" {
		return fleetFake
	}
	return saved
}

// fleetSleep is the container's command on containerd: it sleeps until
// SIGTERM and then exits 0 at once (the shell's wait returns at a trapped
// signal; the sleep is killed with it), so that a pod deleted is gone as
// soon as the kubelet has stopped it, as on the fake runtime, and never
// after its grace period.
const fleetSleep = `trap 'kill $! 2>/dev/null; exit 0' TERM; sleep 2147483647 & wait`

// fleetGrace is the pods' terminationGracePeriodSeconds on containerd. The
// container exits at SIGTERM (exit code 0), so the grace period is never
// waited out and a pod's deleted to gone is the kubelet's and the runtime's
// work, as on the fake runtime; it is long enough that a StopContainer
// slowed by the load (0.5-1.7 s seen at load 11) never reaches the SIGKILL,
// and short enough that a container that ignored SIGTERM would show.
const fleetGrace = 10

// fleetRealPod makes pod run a real container: the busybox image realnode
// imports (never pulled) running fleetSleep, with fleetGrace; its volumes,
// mounts and hostNetwork are kept.
func fleetRealPod(pod *v1.Pod) *v1.Pod {
	c := &pod.Spec.Containers[0]
	c.Image, c.ImagePullPolicy = realnode.BusyboxImage, v1.PullNever
	c.Command = []string{"sh", "-c", fleetSleep}
	grace := int64(fleetGrace)
	pod.Spec.TerminationGracePeriodSeconds = &grace
	return pod
}

// fleetRealNode is a run's containerd (nil on the fake runtime: each method
// is then a no-op), in a CPU accounting cgroup of its own that its shims,
// and the runc and CNI commands they and it run, inherit: the runtime's
// whole CPU, those that exited included.
type fleetRealNode struct {
	rt  *realnode.Runtime
	dir string
	// containerd is its process.
	containerd int
	cg         cpuCgroup
}

// startFleetRuntime starts runtime's containerd in the run's scratch
// directory (nil for the fake runtime), and stops it when b ends, failing b
// if it leaves anything (realnode.StartT).
func startFleetRuntime(b *testing.B, c *objCluster, runtime string) *fleetRealNode {
	b.Helper()
	if runtime != fleetContainerd {
		return nil
	}
	dir := filepath.Join(c.scratch, "rt")
	cg, err := newCPUCgroup("nodevol-fleet-" + filepath.Base(c.scratch))
	if err != nil {
		b.Fatal(err)
	}
	// Registered first, so run last: once the runtime has stopped.
	b.Cleanup(func() {
		if err := cg.remove(); err != nil {
			b.Error(err)
		}
	})
	n := &fleetRealNode{dir: dir, cg: cg}
	n.rt = realnode.StartT(b, realnode.Options{Dir: dir})
	// Registered after StartT, so run before its Stop (and after the
	// kubelet's stop, registered later).
	b.Cleanup(n.drain(b))
	// containerd is the only process naming its directory until a pod
	// starts a shim.
	pids := realnode.ProcessesNaming(dir)
	if len(pids) != 1 {
		b.Fatalf("containerd in %s: processes %v, want one", dir, pids)
	}
	n.containerd = pids[0]
	if err := cg.add(n.containerd); err != nil {
		b.Fatal(err)
	}
	return n
}

// drainWait bounds drain's wait for the shims to exit.
const drainWait = 5 * time.Minute

// drain removes every sandbox and waits until no shim or runc is left
// before realnode's Stop looks for leftovers: a shim exits a moment after
// its task is deleted. containerd 1.6 on a loaded machine (load 40-75)
// also leaves shims that serve no container at all (one or two in a
// hundred pods: a shim started again when the first one's start timed
// out); those are containerd's own, not the kubelet's, so drain kills them
// and logs them rather than letting Stop fail the run. What is still there
// after drainWait is Stop's to report.
func (n *fleetRealNode) drain(b *testing.B) func() {
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), drainWait)
		defer cancel()
		if _, err := n.rt.RemoveAll(ctx); err != nil {
			b.Logf("removing the sandboxes before stopping containerd (Stop tries again): %v", err)
		}
		if orphans := n.killOrphanShims(ctx); len(orphans) > 0 {
			b.Logf("containerd left %d shims that served no container, killed: %v", len(orphans), orphans)
		}
		for ctx.Err() == nil && !slices.Equal(realnode.ProcessesNaming(n.dir), []int{n.containerd}) {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// killOrphanShims kills the runtime's shims whose container (their -id)
// the runtime no longer has, and returns their ids.
func (n *fleetRealNode) killOrphanShims(ctx context.Context) []string {
	containers, err := n.rt.Containers(ctx)
	if err != nil {
		return nil
	}
	sandboxes, err := n.rt.Sandboxes(ctx)
	if err != nil {
		return nil
	}
	known := map[string]bool{}
	for _, c := range containers {
		known[c.Id] = true
	}
	for _, s := range sandboxes {
		known[s.Id] = true
	}
	var orphans []string
	for _, pid := range realnode.ProcessesNaming(n.dir) {
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		if id := shimID(strings.Split(string(cmdline), "\x00")); id != "" && !known[id] {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			orphans = append(orphans, id)
		}
	}
	return orphans
}

// shimID is the container id a shim's command line serves (its -id), ""
// for another process.
func shimID(args []string) string {
	if len(args) == 0 || filepath.Base(args[0]) != "containerd-shim-runc-v2" {
		return ""
	}
	if i := slices.Index(args, "-id"); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}

// endpoint is the kubelet's runtime endpoint ("": the fake runtime's own).
func (n *fleetRealNode) endpoint() string {
	if n == nil {
		return ""
	}
	return n.rt.Endpoint
}

// pod is pod as the runtime runs it.
func (n *fleetRealNode) pod(pod *v1.Pod) *v1.Pod {
	if n == nil {
		return pod
	}
	return fleetRealPod(pod)
}

// sampled is s with the runtime's CPU time.
func (n *fleetRealNode) sampled(b *testing.B, s fleetSample) fleetSample {
	if n == nil {
		return s
	}
	cpu, err := n.cg.usage()
	if err != nil {
		b.Fatal(err)
	}
	s.runtimeCPU = cpu
	return s
}

// rest records the runtime's processes and their memory at rest.
func (n *fleetRealNode) rest(b *testing.B, res *fleetResult) {
	if n == nil {
		return
	}
	pids, err := n.cg.pids()
	if err != nil {
		b.Fatal(err)
	}
	var pss uint64
	for _, pid := range pids {
		p, err := procPSS(pid)
		if errors.Is(err, os.ErrNotExist) {
			continue // exited meanwhile
		}
		if err != nil {
			b.Fatal(err)
		}
		pss += p
	}
	res.Figures["runtime-procs"] = float64(len(pids))
	res.Figures["runtime-pss-MiB"] = float64(pss) / (1 << 20)
}

// whole records the runtime's CPU since it started, and the node's.
func (n *fleetRealNode) whole(b *testing.B, res *fleetResult) {
	if n == nil {
		return
	}
	cpu, err := n.cg.usage()
	if err != nil {
		b.Fatal(err)
	}
	res.Figures["whole-runtime-cpu-s"] = cpu.Seconds()
	res.Figures["whole-node-cpu-s"] = cpu.Seconds() + res.Figures["whole-kubelet-cpu-s/node"]
}

// runtimePhase records a phase's runtime CPU and the node's (its kubelet's
// and its runtime's), on a real runtime (one node); rest's as a share of
// a core.
func (r *fleetResult) runtimePhase(name string, from, to fleetSample) {
	if fleetRuntimeOf(r.Runtime) == fleetFake {
		return
	}
	var kubelet time.Duration
	for i := range to.kubeletCPU {
		kubelet += to.kubeletCPU[i] - from.kubeletCPU[i]
	}
	rt := to.runtimeCPU - from.runtimeCPU
	if name == "rest" {
		d := to.at.Sub(from.at).Seconds()
		r.Figures["rest-runtime-cpu-%"] = 100 * rt.Seconds() / d
		r.Figures["rest-node-cpu-%"] = 100 * (rt + kubelet).Seconds() / d
		return
	}
	r.Figures[name+"-runtime-cpu-s"] = rt.Seconds()
	r.Figures[name+"-node-cpu-s"] = (rt + kubelet).Seconds()
}

// fleetRuntimeFigures are the figures of a run on a real runtime, each
// shown after the figure named by after (at the end if it has none).
var fleetRuntimeFigures = []struct{ after, key, what string }{
	{"start-kubelet-cpu-s/node", "start-runtime-cpu-s", "start: runtime CPU (containerd, its shims, runc), s"},
	{"start-runtime-cpu-s", "start-node-cpu-s", "start: node CPU (kubelet and runtime), s"},
	{"rest-kubelet-cpu-%/node", "rest-runtime-cpu-%", "rest: runtime CPU (containerd, its shims, runc), % of a core"},
	{"rest-runtime-cpu-%", "rest-node-cpu-%", "rest: node CPU (kubelet and runtime), % of a core"},
	{"kubelet-rss-MiB/node", "runtime-pss-MiB", "rest: runtime memory (containerd and its shims, PSS summed), MiB"},
	{"runtime-pss-MiB", "runtime-procs", "rest: runtime processes (containerd and its shims)"},
	{"churn-kubelet-cpu-s/node", "churn-runtime-cpu-s", "churn: runtime CPU (containerd, its shims, runc), s"},
	{"churn-runtime-cpu-s", "churn-node-cpu-s", "churn: node CPU (kubelet and runtime), s"},
	{"delete-kubelet-cpu-s/node", "delete-runtime-cpu-s", "delete: runtime CPU (containerd, its shims, runc), s"},
	{"delete-runtime-cpu-s", "delete-node-cpu-s", "delete: node CPU (kubelet and runtime), s"},
	{"whole-kubelet-cpu-s/node", "whole-runtime-cpu-s", "whole run: runtime CPU (its start to last pod gone), s"},
	{"whole-runtime-cpu-s", "whole-node-cpu-s", "whole run: node CPU (kubelet and runtime), s"},
}

// figuresOf are the figures a run on runtime has, in the summary's order:
// fleetFigures, and on a real runtime fleetRuntimeFigures too.
func figuresOf(runtime string) []struct{ key, what string } {
	if fleetRuntimeOf(runtime) == fleetFake {
		return fleetFigures
	}
	out := slices.Clone(fleetFigures)
	for _, f := range fleetRuntimeFigures {
		row := struct{ key, what string }{f.key, f.what}
		i := slices.IndexFunc(out, func(g struct{ key, what string }) bool { return g.key == f.after })
		if i < 0 {
			out = append(out, row)
			continue
		}
		out = slices.Insert(out, i+1, row)
	}
	return out
}

// cpuCgroup is a cgroup for CPU accounting: cgroup v1's cpuacct
// hierarchy, or cgroup v2's unified one.
type cpuCgroup struct {
	dir string
	v2  bool
}

// cgroupRoot is where cgroup hierarchies are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// newCPUCgroup makes cgroup name below the CPU accounting hierarchy's root:
// cpuacct's on cgroup v1 (a hybrid layout included), the unified one
// otherwise.
func newCPUCgroup(name string) (cpuCgroup, error) {
	g := cpuCgroup{dir: filepath.Join(cgroupRoot, "cpuacct", name)}
	if _, err := os.Stat(filepath.Join(cgroupRoot, "cpuacct", "cpuacct.usage")); err != nil {
		g = cpuCgroup{dir: filepath.Join(cgroupRoot, name), v2: true}
		if _, err := os.Stat(filepath.Join(cgroupRoot, "cgroup.controllers")); err != nil {
			return g, fmt.Errorf("no CPU accounting cgroup: neither cgroup v1's cpuacct nor cgroup v2 at %s", cgroupRoot)
		}
	}
	if err := os.Mkdir(g.dir, 0o755); err != nil {
		return g, fmt.Errorf("the runtime's CPU accounting cgroup: %w", err)
	}
	return g, nil
}

// add moves process pid (all its threads) into the cgroup; its children
// to come are born there.
func (g cpuCgroup) add(pid int) error {
	if err := os.WriteFile(filepath.Join(g.dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		return fmt.Errorf("moving process %d into %s: %w", pid, g.dir, err)
	}
	return nil
}

// usage is the CPU time every process that was ever in the cgroup used
// there.
func (g cpuCgroup) usage() (time.Duration, error) {
	file := "cpuacct.usage"
	if g.v2 {
		file = "cpu.stat"
	}
	data, err := os.ReadFile(filepath.Join(g.dir, file))
	if err != nil {
		return 0, fmt.Errorf("the runtime's CPU time: %w", err)
	}
	return parseCgroupUsage(string(data), g.v2)
}

// parseCgroupUsage parses cpuacct.usage (nanoseconds) or, on v2,
// cpu.stat's usage_usec.
func parseCgroupUsage(data string, v2 bool) (time.Duration, error) {
	if !v2 {
		ns, err := strconv.ParseInt(strings.TrimSpace(data), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("cpuacct.usage %q: %w", data, err)
		}
		return time.Duration(ns), nil
	}
	for line := range strings.SplitSeq(data, "\n") {
		if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
			us, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("cpu.stat's usage_usec %q: %w", v, err)
			}
			return time.Duration(us) * time.Microsecond, nil
		}
	}
	return 0, fmt.Errorf("cpu.stat without usage_usec: %q", data)
}

// pids are the processes in the cgroup now.
func (g cpuCgroup) pids() ([]int, error) {
	data, err := os.ReadFile(filepath.Join(g.dir, "cgroup.procs"))
	if err != nil {
		return nil, fmt.Errorf("the runtime's processes: %w", err)
	}
	var out []int
	for f := range strings.FieldsSeq(string(data)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("%s/cgroup.procs: %w", g.dir, err)
		}
		out = append(out, pid)
	}
	return out, nil
}

// remove removes the cgroup once the runtime has stopped: its processes
// are gone (realnode's Stop kills what is left), but the kernel frees a
// killed one a little later, so it waits up to 10 s for it to be empty.
func (g cpuCgroup) remove() error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids, err := g.pids()
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v still in %s after the runtime stopped", pids, g.dir)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := os.Remove(g.dir); err != nil {
		return fmt.Errorf("removing the runtime's cgroup: %w", err)
	}
	return nil
}

// procPSS is process pid's proportional set size in bytes (its share of
// the pages it shares: the shims share their binary's).
func procPSS(pid int) (uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, fmt.Errorf("reading process %d's memory: %w", pid, err)
	}
	return parsePSS(string(data))
}

// parsePSS is smaps_rollup's Pss in bytes.
func parsePSS(data string) (uint64, error) {
	for line := range strings.SplitSeq(data, "\n") {
		if rest, ok := strings.CutPrefix(line, "Pss:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("smaps_rollup's Pss %q: %w", rest, err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("smaps_rollup without Pss")
}
