package kubeletbench

import (
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodevol/nodevol/bench/internal/apiaudit"
	"github.com/nodevol/nodevol/internal/kubelettest"
	"github.com/nodevol/nodevol/internal/roottest"
)

// BenchmarkPodObjects measures, side by side, the stock kubelet v1.37.2
// (on a fake container runtime) and nodevol's example node agent, each a
// process of its own with the node's own client certificate against
// testenv's kube-apiserver (Node authorizer, NodeRestriction), on the same
// pods: each with a projected kube-api-access volume (token, the cluster
// CA, the namespace), a configMap, a secret and an emptyDir volume. It
// runs once whatever b.N (make bench-objects passes -benchtime 1x) and
// reports:
//
//   - req/pod-start, vol-req/pod-start: the node's requests, as the API
//     server's audit log has them (bench/internal/apiaudit), from the pods' creation until every
//     pod's files exist, per pod; all of them, and those of
//     volumeResources only (configmaps, secrets, serviceaccounts/token).
//   - req/h-idle, vol-req/h-idle: the same at rest, over -objects.idle,
//     extrapolated to an hour.
//   - update-p50-ms, update-p99-ms, update-missed-pods: from the update of
//     the configMap all pods use to its new content in each pod's file
//     (read every 10 ms), across pods; pods that did not see it within 3
//     minutes are missed.
//   - rss-KiB/pod: the process's VmRSS at rest with the pods less its VmRSS
//     before they were created, per pod (the kubelet's includes its per-pod
//     state that is not about volumes: pod workers, status, probes).
//
// It needs root (the volumes are real tmpfs mounts) and testenv's binaries
// (make testenv-bins); it builds the kubelet once into the user's cache
// directory.
func BenchmarkPodObjects(b *testing.B) {
	roottest.Require(b)
	for _, side := range []string{"kubelet", "nodevol"} {
		b.Run("side="+side, func(b *testing.B) {
			b.Run(fmt.Sprintf("pods=%d", *objPods), func(b *testing.B) { runPodObjects(b, side, *objPods) })
		})
	}
}

// volumeResources are the resources a node reads or asks for because of
// its pods' configMap, secret and projected volumes: the objects (watched
// or read one by one) and the service-account tokens (TokenRequest).
var volumeResources = []string{"configmaps", "secrets", "serviceaccounts/token"}

var (
	objPods = flag.Int("objects.pods", 50, "BenchmarkPodObjects: pods on the node")
	objIdle = flag.Duration("objects.idle", 10*time.Minute, "BenchmarkPodObjects: the window at rest whose requests are counted")
)

const (
	// objSettle lets the process finish its own start (or the last
	// update) before a figure at rest is taken.
	objSettle      = 10 * time.Second
	objFilesWait   = 5 * time.Minute
	objUpdateWait  = 3 * time.Minute
	objUpdateValue = "v2"
)

func runPodObjects(b *testing.B, side string, n int) {
	c := startObjCluster(b)
	var p *kubelettest.Process
	root := filepath.Join(c.scratch, "root")
	if side == "kubelet" {
		p = startKubelet(b, c)
	} else {
		p = startAgent(b, c)
	}
	ctx := b.Context()
	time.Sleep(objSettle)
	rss0, err := p.RSS()
	if err != nil {
		b.Fatal(err)
	}

	startFrom := time.Now()
	dirs, err := c.createPods(ctx, root, n)
	if err != nil {
		b.Fatal(err)
	}
	if missing := waitPodFiles(dirs, objFilesWait); len(missing) > 0 {
		b.Fatalf("%d of %d pods lack their files after %v, for example %s; the log: %s", len(missing), n, objFilesWait,
			missing[0], filepath.Join(c.scratch, side))
	}
	startTo := time.Now()
	start, err := apiaudit.Count(c.auditLog, objUser, startFrom, startTo)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("%s: every pod's files after %v; the node's requests meanwhile:\n%s", side, startTo.Sub(startFrom).Round(time.Millisecond), start)
	if side == "kubelet" {
		running, notRunning := runningPods(ctx, c, n, time.Minute)
		b.Logf("kubelet: %d of %d pods Running; the others: %v", running, n, notRunning)
	}

	lat, missed, err := measureUpdate(ctx, c, dirs)
	if err != nil {
		b.Fatal(err)
	}

	time.Sleep(objSettle)
	idleFrom := time.Now()
	time.Sleep(*objIdle)
	idleTo := time.Now()
	idle, err := apiaudit.Count(c.auditLog, objUser, idleFrom, idleTo)
	if err != nil {
		b.Fatal(err)
	}
	rssN, err := p.RSS()
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("%s: the node's requests in %v at rest:\n%s", side, idleTo.Sub(idleFrom).Round(time.Second), idle)
	b.Logf("%s: VmRSS %d KiB with no pod, %d KiB with %d pods", side, rss0>>10, rssN>>10, n)

	b.ReportMetric(float64(start.Total())/float64(n), "req/pod-start")
	b.ReportMetric(float64(start.Of(volumeResources...))/float64(n), "vol-req/pod-start")
	perHour := float64(time.Hour) / float64(idleTo.Sub(idleFrom))
	b.ReportMetric(float64(idle.Total())*perHour, "req/h-idle")
	b.ReportMetric(float64(idle.Of(volumeResources...))*perHour, "vol-req/h-idle")
	b.ReportMetric(percentileMs(lat, 0.50), "update-p50-ms")
	b.ReportMetric(percentileMs(lat, 0.99), "update-p99-ms")
	b.ReportMetric(float64(missed), "update-missed-pods")
	b.ReportMetric((float64(rssN)-float64(rss0))/1024/float64(n), "rss-KiB/pod")
	b.ReportMetric(startTo.Sub(startFrom).Seconds(), "start-s")
	b.ReportMetric(0, "ns/op")
}

// measureUpdate updates the configMap every pod uses and reads each pod's
// file every 10 ms until it holds the new content, for at most
// objUpdateWait; it returns the delays of the pods that saw it and how
// many did not.
func measureUpdate(ctx context.Context, c *objCluster, dirs []string) ([]time.Duration, int, error) {
	cm, err := c.admin.CoreV1().ConfigMaps(objNS).Get(ctx, objCM, metav1.GetOptions{})
	if err != nil {
		return nil, 0, fmt.Errorf("reading configMap %s/%s: %w", objNS, objCM, err)
	}
	cm.Data[objCMKey] = objUpdateValue
	from := time.Now()
	if _, err := c.admin.CoreV1().ConfigMaps(objNS).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		return nil, 0, fmt.Errorf("updating configMap %s/%s: %w", objNS, objCM, err)
	}
	pending := slices.Clone(dirs)
	var lat []time.Duration
	for len(pending) > 0 && time.Since(from) < objUpdateWait {
		var still []string
		for _, dir := range pending {
			data, err := os.ReadFile(filepath.Join(dir, podFiles[0]))
			if err == nil && string(data) == objUpdateValue {
				lat = append(lat, time.Since(from))
				continue
			}
			still = append(still, dir)
		}
		pending = still
		time.Sleep(10 * time.Millisecond)
	}
	return lat, len(pending), nil
}

// percentileMs is the nearest-rank percentile q of d in milliseconds; NaN
// when d is empty.
func percentileMs(d []time.Duration, q float64) float64 {
	if len(d) == 0 {
		return math.NaN()
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := max(int(math.Ceil(q*float64(len(s))))-1, 0)
	return float64(s[i]) / float64(time.Millisecond)
}

// runningPods waits up to timeout for the n pods to be Running and
// returns how many are, and why the others are not (their phase and
// their container's waiting reason).
func runningPods(ctx context.Context, c *objCluster, n int, timeout time.Duration) (int, []string) {
	deadline := time.Now().Add(timeout)
	for {
		pods, err := c.admin.CoreV1().Pods(objNS).List(ctx, metav1.ListOptions{})
		running := 0
		var others []string
		if err == nil {
			for _, p := range pods.Items {
				if p.Status.Phase == v1.PodRunning {
					running++
					continue
				}
				why := string(p.Status.Phase)
				for _, cs := range p.Status.ContainerStatuses {
					if w := cs.State.Waiting; w != nil {
						why += " " + w.Reason + ": " + w.Message
					}
				}
				others = append(others, p.Name+" "+why)
			}
		}
		if running == n || time.Now().After(deadline) {
			return running, others
		}
		time.Sleep(time.Second)
	}
}
