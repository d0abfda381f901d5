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

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/apiaudit"
	"github.com/nodevol/nodevol/internal/roottest"
)

var (
	scaleOthers  = flag.String("scale.others", "0,1000", "BenchmarkClusterSize: the numbers of other PersistentVolumes and bound claims in the cluster, one run each, comma-separated")
	scalePods    = flag.Int("scale.pods", 50, "BenchmarkClusterSize: the node's own pods, each with one CSI claim, a configMap and a secret")
	scaleSamples = flag.Int("scale.samples", 3, "BenchmarkClusterSize: agents measured one after another per run, each on a node of its own")
	scaleRest    = flag.Duration("scale.rest", 130*time.Second, "BenchmarkClusterSize: the window at rest in which the agent's heap and VmRSS are sampled (longer than the Go runtime's 2-minute forced GC)")
	scaleWorkers = flag.Int("scale.workers", 64, "BenchmarkClusterSize: concurrent creates of the other claims")
)

const (
	// settle lets the agent finish the pods' work (a volume's first
	// status, the Node's volumesInUse) before the window at rest.
	settle      = 10 * time.Second
	sampleEvery = 2 * time.Second
	mountWait   = 5 * time.Minute
	heapMetric  = "go_memstats_heap_inuse_bytes"
	gcMetric    = "go_gc_duration_seconds_count"
	mib         = 1 << 20
)

// claimResources are what node-restricted mode reads one at a time.
var claimResources = []string{"persistentvolumeclaims", "persistentvolumes", "volumeattachments"}

// BenchmarkClusterSize runs the example node agent, node-restricted, with
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
	heap, rss uint64 // lowest at rest
	gcs       int    // GCs in the window at rest
	requests  apiaudit.Counts
	mount     time.Duration
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
		s := runSample(b, c, node, *scalePods)
		b.Logf("others=%d %s: mounted in %v; at rest heap in use %.1f MiB, VmRSS %.1f MiB (lowest, %d GCs); %d requests:\n%s",
			k, node, s.mount.Round(time.Millisecond), float64(s.heap)/mib, float64(s.rss)/mib, s.gcs, s.requests.Total(), s.requests)
		samples = append(samples, s)
	}
	report(b, "heap-MiB", samples, func(s sample) float64 { return float64(s.heap) / mib })
	report(b, "rss-MiB", samples, func(s sample) float64 { return float64(s.rss) / mib })
	report(b, "req", samples, func(s sample) float64 { return float64(s.requests.Total()) })
	report(b, "claim-req", samples, func(s sample) float64 { return float64(s.requests.Of(claimResources...)) })
	report(b, "mount-s", samples, func(s sample) float64 { return s.mount.Seconds() })
	b.ReportMetric(created.Seconds(), "create-s")
	b.ReportMetric(0, "ns/op")
}

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
func runSample(b *testing.B, c *cluster, node string, pods int) sample {
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
	if s.heap, s.rss, s.gcs, err = atRest(ctx, a); err != nil {
		b.Fatal(err)
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

// createPods creates n pods on node, each with its claim, the configMap
// and the secret, and returns their UIDs and their claims' volume handles.
func (c *cluster) createPods(ctx context.Context, node string, n int) (map[string]string, error) {
	uids := make(map[string]string, n)
	for i := range n {
		claim := claimName(node, i)
		pod := csitest.Pod(appsNS, fmt.Sprintf("%s-pod-%03d", node, i), csitest.PodNode(node),
			csitest.WithPVC("data", claim, false),
			csitest.WithVolume(v1.Volume{Name: "config", VolumeSource: v1.VolumeSource{
				ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: cmName}}}}, true),
			csitest.WithVolume(v1.Volume{Name: "creds", VolumeSource: v1.VolumeSource{
				Secret: &v1.SecretVolumeSource{SecretName: secName}}}, true))
		created, err := c.admin.CoreV1().Pods(appsNS).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf(createErr, "pod "+pod.Name, err)
		}
		uids[string(created.UID)] = "handle-" + appsNS + "-" + claim
	}
	return uids, nil
}

// mounted tells whether every pod's claim is published by the driver and
// its configMap's and secret's files are written.
func (c *cluster) mounted(a *agent, uids map[string]string) bool {
	for uid, handle := range uids {
		if len(c.driver.Published(handle)) == 0 {
			return false
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

// atRest waits settle, then reads the agent's heap in use and VmRSS every
// sampleEvery for -scale.rest and returns the lowest of each, and the
// GCs the runtime ran meanwhile.
func atRest(ctx context.Context, a *agent) (heap, rss uint64, gcs int, err error) {
	select {
	case <-time.After(settle):
	case <-ctx.Done():
		return 0, 0, 0, ctx.Err()
	}
	heap, rss = math.MaxUint64, math.MaxUint64
	gcFirst := -1.0
	var gcLast float64
	for end := time.Now().Add(*scaleRest); time.Now().Before(end); {
		m, err := a.metrics(heapMetric, gcMetric)
		if err != nil {
			return 0, 0, 0, err
		}
		r, err := a.rss()
		if err != nil {
			return 0, 0, 0, err
		}
		heap, rss, gcLast = min(heap, uint64(m[heapMetric])), min(rss, r), m[gcMetric]
		if gcFirst < 0 {
			gcFirst = gcLast
		}
		select {
		case <-time.After(sampleEvery):
		case <-ctx.Done():
			return 0, 0, 0, ctx.Err()
		}
	}
	return heap, rss, int(gcLast - gcFirst), nil
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
			if len(c.driver.Published(handle)) > 0 {
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
