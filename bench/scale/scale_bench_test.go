package scale

import (
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodevol/nodevol/bench/internal/apiaudit"
	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/roottest"
)

var (
	scaleOthers  = flag.String("scale.others", "0,1000", "BenchmarkClusterSize: the numbers of other PersistentVolumes and bound claims in the cluster, one run each, comma-separated")
	scalePods    = flag.Int("scale.pods", 50, "BenchmarkClusterSize: the node's own pods, each with one CSI claim, a configMap and a secret (only the claim with -scale.w1)")
	scaleW1      = flag.Bool("scale.w1", false, "BenchmarkClusterSize: the pods carry one CSI claim each and nothing else (workload W1)")
	scaleInf     = flag.Bool("scale.informers", false, "BenchmarkClusterSize: run the agent with --cluster-informers, reading claims, volumes and attachments with informers; its node's user is granted list and watch of them by RBAC")
	scaleSamples = flag.Int("scale.samples", 3, "BenchmarkClusterSize: agents measured one after another per run, each on a node of its own")
	scaleRest    = flag.Duration("scale.rest", 130*time.Second, "BenchmarkClusterSize: the window at rest in which the agent's heap and VmRSS are sampled (longer than the Go runtime's 2-minute forced GC)")
	scaleHeap    = flag.String("scale.heapprofile", "", "BenchmarkClusterSize: a directory where each agent's heap profile is written at the end of its window at rest (others=K-node-N.heap; the agent runs with --profiling-address)")
	scaleWorkers = flag.Int("scale.workers", 64, "BenchmarkClusterSize: concurrent creates of the other claims")
	scaleAgents  = flag.String("scale.agents", "", "BenchmarkClusterSize: comma-separated paths of node agent binaries built beforehand, taken in turn by the samples (sample i runs binary i modulo their number), to compare builds in one cluster; default: examples/nodeagent built from this tree")
)

const (
	// settle lets the agent finish the pods' work (a volume's first
	// status, the Node's volumesInUse) before the window at rest.
	settle      = 10 * time.Second
	sampleEvery = 2 * time.Second
	mountWait   = 5 * time.Minute
	heapMetric  = "go_memstats_heap_inuse_bytes"
	gcMetric    = "go_gc_duration_seconds_count"
	goMetric    = "go_goroutines"
	stackMetric = "go_memstats_stack_inuse_bytes"
	mib         = 1 << 20
)

// claimResources are what the agent reads one at a time (by default,
// without --cluster-informers).
var claimResources = []string{"persistentvolumeclaims", "persistentvolumes", "volumeattachments"}

// BenchmarkClusterSize runs the example node agent (in its default mode,
// unless -scale.informers), with
// the node's own client certificate against testenv's kube-apiserver, for
// each -scale.others K: K other PersistentVolumes and bound claims are
// created first (as admin, -scale.workers at once), then -scale.samples
// agents, one after another and each on a node of its own, mount
// -scale.pods pods (one CSI claim of csitest's driver, a configMap and a
// secret each), rest, and give their pods back. Per sample it reads, in
// the window at rest (-scale.rest, from 10 s after the last mount), the
// minimum of the agent's heap in use (/metrics, every 2 s: another
// process's GC cannot be forced) and of its VmRSS, and counts the agent's
// requests from its start to the window's end from the API server's
// audit log. It reports the lowest and highest sample of each, and the
// time the K pairs took to create. It runs once whatever b.N (make
// bench-scale passes -benchtime 1x). Root only: the secrets are tmpfs
// mounts.
func BenchmarkClusterSize(b *testing.B) {
	roottest.Require(b)
	ks, err := parseInts(*scaleOthers)
	if err != nil {
		b.Fatalf("-scale.others: %v", err)
	}
	for _, k := range ks {
		b.Run(fmt.Sprintf("others=%d", k), func(b *testing.B) { runClusterSize(b, k) })
	}
}

// sample is what one agent measured.
type sample struct {
	rest     rest
	requests apiaudit.Counts // from the agent's start to the window's end
	mount    time.Duration
}

func runClusterSize(b *testing.B, k int) {
	nodes := make([]string, *scaleSamples)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("node-%d", i+1)
	}
	c := startCluster(b, nodes)
	from := time.Now()
	if err := c.createOthers(b.Context(), k, *scaleWorkers); err != nil {
		b.Fatal(err)
	}
	created := time.Since(from)
	b.Logf("others=%d: the other volumes and bound claims created in %v", k, created.Round(time.Millisecond))
	var samples []sample
	for _, node := range nodes {
		s := runSample(b, c, node, *scalePods, k)
		r := s.rest
		b.Logf("others=%d %s: mounted in %v; at rest heap in use %.1f MiB (lowest), VmRSS %.1f-%.1f MiB "+
			"(lowest: RssAnon %.1f, RssFile %.1f, RssShmem %.1f), VmHWM %.1f MiB, %d GCs, %d goroutines, %.1f MiB of stacks; %d requests from the start:\n%s"+
			"requests in the %v at rest:\n%s",
			k, node, s.mount.Round(time.Millisecond), mb(r.heap), mb(r.low.VmRSS), mb(r.rssMax),
			mb(r.low.RssAnon), mb(r.low.RssFile), mb(r.low.RssShmem), mb(r.hwm), r.gcs, r.goroutines, mb(r.stack),
			s.requests.Total(), s.requests, r.window.Round(time.Second), r.requests)
		samples = append(samples, s)
	}
	report(b, "heap-MiB", samples, func(s sample) float64 { return mb(s.rest.heap) })
	report(b, "rss-MiB", samples, func(s sample) float64 { return mb(s.rest.low.VmRSS) })
	report(b, "rss-high-MiB", samples, func(s sample) float64 { return mb(s.rest.rssMax) })
	report(b, "hwm-MiB", samples, func(s sample) float64 { return mb(s.rest.hwm) })
	report(b, "rss-anon-MiB", samples, func(s sample) float64 { return mb(s.rest.low.RssAnon) })
	report(b, "rss-file-MiB", samples, func(s sample) float64 { return mb(s.rest.low.RssFile + s.rest.low.RssShmem) })
	report(b, "req", samples, func(s sample) float64 { return float64(s.requests.Total()) })
	report(b, "claim-req", samples, func(s sample) float64 { return float64(s.requests.Of(claimResources...)) })
	report(b, "rest-req/h", samples, func(s sample) float64 { return s.rest.perHour(false) })
	report(b, "rest-watch/h", samples, func(s sample) float64 { return s.rest.perHour(true) })
	report(b, "mount-s", samples, func(s sample) float64 { return s.mount.Seconds() })
	b.ReportMetric(created.Seconds(), "create-s")
	if fi, err := os.Stat(agentBinary(b, "node-1")); err == nil {
		b.ReportMetric(mb(uint64(fi.Size())), "binary-MiB")
	}
	b.ReportMetric(0, "ns/op")
}

func mb(n uint64) float64 { return float64(n) / mib }

// report reports the lowest and the highest of the samples' f as
// unit-min and unit-max.
func report(b *testing.B, unit string, samples []sample, f func(sample) float64) {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range samples {
		lo, hi = min(lo, f(s)), max(hi, f(s))
	}
	b.ReportMetric(lo, unit+"-min")
	b.ReportMetric(hi, unit+"-max")
}

// runSample creates node's claims, starts its agent, creates its pods,
// waits for their volumes, measures the agent at rest, then deletes the
// pods, waits for their volumes to be given back and stops the agent.
func runSample(b *testing.B, c *cluster, node string, pods, others int) sample {
	ctx := b.Context()
	for i := range pods {
		if err := c.createClaim(ctx, appsNS, claimName(node, i)); err != nil {
			b.Fatal(err)
		}
	}
	var from time.Time
	a := startAgent(b, c, node, &from)
	created := time.Now()
	uids, err := c.createPods(ctx, node, pods)
	if err != nil {
		b.Fatal(err)
	}
	if err := a.wait(ctx, "every pod's volumes", mountWait, func() bool { return c.mounted(a, uids) }); err != nil {
		b.Fatal(err)
	}
	s := sample{mount: time.Since(created)}
	if s.rest, err = atRest(ctx, c, a); err != nil {
		b.Fatal(err)
	}
	if *scaleHeap != "" {
		base := filepath.Join(*scaleHeap, fmt.Sprintf("others=%d-%s", others, node))
		// The mappings first: the profile's GC and transfer touch pages.
		if err := a.smaps(base + ".smaps"); err != nil {
			b.Fatal(err)
		}
		if err := a.heapProfile(base + ".heap"); err != nil {
			b.Fatal(err)
		}
	}
	if s.requests, err = apiaudit.Count(c.auditLog, nodeUser(node), from, time.Now()); err != nil {
		b.Fatal(err)
	}
	if err := c.givePodsBack(ctx, a, uids); err != nil {
		b.Fatal(err)
	}
	a.stop()
	return s
}

func claimName(node string, i int) string { return fmt.Sprintf("%s-claim-%03d", node, i) }

// createPods creates n pods on node, each with its claim, and unless
// -scale.w1 the configMap and the secret, and returns their UIDs and
// their claims' volume handles.
func (c *cluster) createPods(ctx context.Context, node string, n int) (map[string]string, error) {
	uids := make(map[string]string, n)
	for i := range n {
		claim := claimName(node, i)
		spec := csitest.PodSpec{Node: node, Volumes: []csitest.PodVolume{{Name: "data", Claim: claim}}}
		if !*scaleW1 {
			spec.Volumes = append(spec.Volumes,
				csitest.PodVolume{Name: "config", Source: v1.VolumeSource{
					ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: cmName}}}, ReadOnly: true},
				csitest.PodVolume{Name: "creds", Source: v1.VolumeSource{
					Secret: &v1.SecretVolumeSource{SecretName: secName}}, ReadOnly: true})
		}
		pod := csitest.Pod(appsNS, fmt.Sprintf("%s-pod-%03d", node, i), spec)
		created, err := c.admin.CoreV1().Pods(appsNS).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf(createErr, "pod "+pod.Name, err)
		}
		uids[string(created.UID)] = "handle-" + appsNS + "-" + claim
	}
	return uids, nil
}

// mounted tells whether every pod's claim is published by the driver and,
// unless -scale.w1, its configMap's and secret's files are written.
func (c *cluster) mounted(a *agent, uids map[string]string) bool {
	for uid, handle := range uids {
		if len(c.driver.PublishedVolumes()[handle]) == 0 {
			return false
		}
		if *scaleW1 {
			continue
		}
		vols := filepath.Join(a.root, "pods", uid, "volumes")
		for _, f := range []string{filepath.Join("kubernetes.io~configmap", "config", cmKey), filepath.Join("kubernetes.io~secret", "creds", secKey)} {
			if _, err := os.Stat(filepath.Join(vols, f)); err != nil {
				return false
			}
		}
	}
	return true
}

// rest is what the agent did in the window at rest.
type rest struct {
	heap       uint64          // lowest heap in use
	low        procStatus      // the status read when VmRSS was lowest
	rssMax     uint64          // highest VmRSS
	hwm        uint64          // VmHWM at the window's end: the peak since the start
	gcs        int             // GCs the runtime ran
	goroutines int             // the most goroutines
	stack      uint64          // the most stack in use
	requests   apiaudit.Counts // the agent's requests in the window
	window     time.Duration
}

// perHour is the number of the window's requests, watches or all but
// watches, scaled to an hour.
func (r rest) perHour(watches bool) float64 {
	n := 0
	for key, v := range r.requests {
		if strings.HasPrefix(key, "watch ") == watches {
			n += v
		}
	}
	return float64(n) * float64(time.Hour) / float64(r.window)
}

// atRest waits settle, then reads the agent's heap in use and
// /proc/{pid}/status every sampleEvery for -scale.rest, and counts the
// agent's requests in that window.
func atRest(ctx context.Context, c *cluster, a *agent) (rest, error) {
	select {
	case <-time.After(settle):
	case <-ctx.Done():
		return rest{}, ctx.Err()
	}
	r := rest{heap: math.MaxUint64, low: procStatus{VmRSS: math.MaxUint64}}
	gcFirst := -1.0
	var gcLast float64
	from := time.Now()
	for end := from.Add(*scaleRest); time.Now().Before(end); {
		m, err := a.metrics(heapMetric, gcMetric, goMetric, stackMetric)
		if err != nil {
			return rest{}, err
		}
		st, err := a.status()
		if err != nil {
			return rest{}, err
		}
		r.heap, r.rssMax, r.hwm, gcLast = min(r.heap, uint64(m[heapMetric])), max(r.rssMax, st.VmRSS), st.VmHWM, m[gcMetric]
		r.goroutines, r.stack = max(r.goroutines, int(m[goMetric])), max(r.stack, uint64(m[stackMetric]))
		if st.VmRSS < r.low.VmRSS {
			r.low = st
		}
		if gcFirst < 0 {
			gcFirst = gcLast
		}
		select {
		case <-time.After(sampleEvery):
		case <-ctx.Done():
			return rest{}, ctx.Err()
		}
	}
	to := time.Now()
	r.gcs, r.window = int(gcLast-gcFirst), to.Sub(from)
	var err error
	if r.requests, err = apiaudit.Count(c.auditLog, nodeUser(a.node), from, to); err != nil {
		return rest{}, err
	}
	return r, nil
}

// givePodsBack deletes the pods and waits until the driver publishes none
// of their claims and nothing is mounted under the agent's root.
func (c *cluster) givePodsBack(ctx context.Context, a *agent, uids map[string]string) error {
	pods, err := c.admin.CoreV1().Pods(appsNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing the pods of %s: %w", a.node, err)
	}
	zero := int64(0)
	for _, p := range pods.Items {
		if _, ok := uids[string(p.UID)]; !ok {
			continue
		}
		if err := c.admin.CoreV1().Pods(appsNS).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			return fmt.Errorf("deleting pod %s: %w", p.Name, err)
		}
	}
	return a.wait(ctx, "every pod's volumes given back", mountWait, func() bool {
		for _, handle := range uids {
			if len(c.driver.PublishedVolumes()[handle]) > 0 {
				return false
			}
		}
		mps, err := mountsUnder(a.root)
		return err == nil && len(mps) == 0
	})
}

// parseInts parses a comma-separated list of non-negative integers.
func parseInts(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%q is not a non-negative integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}
