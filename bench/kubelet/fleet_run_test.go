package kubeletbench

import (
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// fleetSpec is one run of BenchmarkFleet: side's binary on nodes nodes of
// pods pods each.
type fleetSpec struct {
	side        string
	bin         string
	nodes, pods int
	run         int
	// claims gives each pod a CSI claim too (-fleet.claims).
	claims bool
	// runtime is fleetFake or fleetContainerd; endpoint is the real
	// runtime's CRI endpoint, once started ("" on the fake one).
	runtime, endpoint string
}

const (
	// fleetRunningWait and fleetGoneWait bound a phase's wait for every
	// pod to be Running or gone.
	fleetRunningWait = 10 * time.Minute
	fleetGoneWait    = 10 * time.Minute
)

// fleetRun is a run in progress: the cluster, its nodes and the samples
// each phase starts from.
type fleetRun struct {
	b       *testing.B
	spec    fleetSpec
	c       *objCluster
	nodes   []fleetNode
	tracker *podTracker
	rt      *fleetRealNode
	api     int
	res     *fleetResult
	// drivers are the nodes' CSI drivers (claims only).
	drivers []fleetDriver
}

// runFleet runs spec's phases (BenchmarkFleet) and returns their figures.
func runFleet(b *testing.B, spec fleetSpec) *fleetResult {
	c := startObjCluster(b)
	rt := startFleetRuntime(b, c, spec.runtime)
	spec.endpoint = rt.endpoint()
	r := &fleetRun{b: b, spec: spec, c: c, rt: rt, res: newFleetResult(spec)}
	ctx := b.Context()
	var err error
	if r.api, err = apiServerPid(r.c.env.Port()); err != nil {
		b.Fatal(err)
	}
	if err := createFleetObjects(ctx, r.c, spec.nodes, spec.pods); err != nil {
		b.Fatal(err)
	}
	r.claimsBefore(ctx)
	r.tracker = startPodTracker(b, r.c)

	boot := r.begin()
	r.nodes = startFleetNodes(b, r.c, spec)
	r.claimsBoot()
	r.end("boot", boot)
	r.claimsProvision(ctx)
	time.Sleep(objSettle)

	pods := r.pods(0, spec.pods, 0)
	start := r.begin()
	r.must(r.tracker.create(ctx, r.c, pods))
	r.waitPods(r.tracker.running, pods, "Running", fleetRunningWait)
	r.end("start", start)
	r.res.latency("create-running", r.tracker.latencies(r.tracker.created, r.tracker.running, pods))

	time.Sleep(objSettle)
	rest := r.begin()
	time.Sleep(*fleetIdle)
	r.end("rest", rest)
	r.sampleRest()

	churned := int(float64(spec.pods)**fleetChurn + 0.5)
	old, again := r.pods(0, churned, 0), r.pods(0, churned, 1)
	churn := r.begin()
	r.must(r.tracker.remove(ctx, r.c, old))
	r.waitPods(r.tracker.gone, old, "gone", fleetGoneWait)
	r.must(r.tracker.create(ctx, r.c, again))
	r.waitPods(r.tracker.running, again, "Running", fleetRunningWait)
	r.end("churn", churn)
	r.res.latency("churn-delete-gone", r.tracker.latencies(r.tracker.deleted, r.tracker.gone, old))
	r.res.latency("churn-create-running", r.tracker.latencies(r.tracker.created, r.tracker.running, again))

	// Each node's pods in two lists (the churned ones, the others): two
	// goroutines a node delete them.
	all := slices.Concat(again, r.pods(churned, spec.pods, 0))
	del := r.begin()
	profiled := r.profile("delete")
	r.must(r.tracker.remove(ctx, r.c, all))
	r.waitPods(r.tracker.gone, all, "gone", fleetGoneWait)
	r.end("delete", del)
	r.must(profiled())
	r.claimsUnstaged(ctx)
	r.res.latency("delete-gone", r.tracker.latencies(r.tracker.deleted, r.tracker.gone, all))
	r.res.wholeCPU(b, r.nodes)
	r.rt.whole(b, r.res)
	return r.res
}

// pods are the pods [from, to) of every node in generation gen, by node.
func (r *fleetRun) pods(from, to, gen int) [][]*v1.Pod {
	out := make([][]*v1.Pod, len(r.nodes))
	for n, node := range r.nodes {
		for i := from; i < to; i++ {
			p := fleetPod(node.name, i, gen)
			if r.spec.claims {
				p = withFleetClaim(p, node.name, i)
			}
			out[n] = append(out[n], r.rt.pod(p))
		}
	}
	return out
}

// begin samples what a phase's figures are differences of: the time, and
// the CPU time of the API server, of each kubelet and of a real runtime.
func (r *fleetRun) begin() fleetSample {
	return r.rt.sampled(r.b, sampleFleet(r.b, r.api, r.nodes))
}

// end records the phase that began with from: its length, the nodes'
// requests meanwhile (the audit log), and the CPU the API server and the
// kubelets used.
func (r *fleetRun) end(phase string, from fleetSample) {
	to := r.rt.sampled(r.b, sampleFleet(r.b, r.api, r.nodes))
	if len(from.kubeletCPU) == 0 {
		// boot: the kubelets started with no CPU time used.
		from.kubeletCPU = make([]time.Duration, len(to.kubeletCPU))
	}
	users := make([]string, len(r.nodes))
	for i, n := range r.nodes {
		users[i] = kubeletUser(n.name)
	}
	counts, err := countNodes(r.c.auditLog, users, from.at, to.at)
	if err != nil {
		r.b.Fatal(err)
	}
	r.res.phase(phase, from, to, counts)
	r.res.runtimePhase(phase, from, to)
	r.b.Logf("%s: %s took %v; the nodes' requests, per node:\n%s", r.spec.side, phase, to.at.Sub(from.at).Round(time.Millisecond),
		counts.perNode(len(r.nodes)))
}

// sampleRest records what is measured at rest but not as a difference:
// the watches each node holds, and the RSS of the kubelets and the API
// server.
func (r *fleetRun) sampleRest() {
	users := make([]string, len(r.nodes))
	for i, n := range r.nodes {
		users[i] = kubeletUser(n.name)
	}
	watches, err := openWatches(r.c.auditLog, users)
	if err != nil {
		r.b.Fatal(err)
	}
	r.b.Logf("%s: the watches held at rest, per node:\n%s", r.spec.side, watches.perNode(len(r.nodes)))
	r.res.rest(r.b, r.api, r.nodes, watches)
	r.rt.rest(r.b, r.res)
}

// waitPods waits for every pod of pods to have a time in m, or fails.
func (r *fleetRun) waitPods(m map[string]time.Time, pods [][]*v1.Pod, what string, timeout time.Duration) {
	if missing := r.tracker.wait(m, pods, timeout); len(missing) > 0 {
		r.b.Fatalf("%s: %d pods not %s after %v, for example %s; the logs under %s", r.spec.side, len(missing), what, timeout,
			missing[0], r.c.scratch)
	}
}

// must fails the benchmark on err.
func (r *fleetRun) must(err error) {
	if err != nil {
		r.b.Fatal(err)
	}
}

// kubeletUser is node's user name under the Node authorizer.
func kubeletUser(node string) string { return "system:node:" + node }
