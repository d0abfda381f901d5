package kubeletfork_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodevol/nodevol/internal/kubelettest"
)

// summary is the part of the kubelet's /stats/summary (stats/v1alpha1)
// the test reads: each pod's volumes.
type summary struct {
	Pods []struct {
		PodRef struct {
			Name, Namespace, UID string
		} `json:"podRef"`
		Volumes []volumeStats `json:"volume"`
	} `json:"pods"`
}

type volumeStats struct {
	Name   string `json:"name"`
	PVCRef *struct {
		Name, Namespace string
	} `json:"pvcRef"`
	UsedBytes  *uint64 `json:"usedBytes"`
	InodesUsed *uint64 `json:"inodesUsed"`
}

// String is a volume as checkStats compares it: its name, its claim and
// whether it reports used bytes and inodes.
func (v volumeStats) String() string {
	s := v.Name
	if v.PVCRef != nil {
		s += " claim " + v.PVCRef.Namespace + "/" + v.PVCRef.Name
	}
	if v.UsedBytes != nil && *v.UsedBytes > 0 && v.InodesUsed != nil && *v.InodesUsed > 0 {
		s += " used"
	}
	return s
}

// checkStats checks the round's pods' volumes in the fork's stats summary
// (its /stats/summary, read at its port): as the stock kubelet v1.37.2
// lists them (volume_stat_calculator.go: every volume of the pod whose
// mounter reports metrics, a claim's with its claim), every volume of
// every pod, here all with files, so with used bytes and inodes: the CSI
// claim and inline volume (the loop driver's NodeGetVolumeStats), the
// configMap, secret, downwardAPI and kube-api-access projected volumes and
// the emptyDir (a du walk, with a file written in it). The fake runtime
// reports no container, so the kubelet lists no pod: the test gives it
// the stats of each container.
func (r *round) checkStats(p *kubelettest.Process) {
	e := r.e
	e.t.Helper()
	for _, pod := range r.pods {
		if strings.HasPrefix(pod.Name, "objects") {
			if err := os.WriteFile(filepath.Join(r.volumesDir(pod), "kubernetes.io~empty-dir", "cache", "data"), make([]byte, 64<<10), 0o644); err != nil {
				e.t.Fatal(err)
			}
		}
	}
	e.fakeContainerStats()
	want := map[string][]string{}
	for _, pod := range r.pods {
		for _, v := range pod.Spec.Volumes {
			if v.FlexVolume != nil {
				// The script driver's init does not say supportsMetrics:
				// the kubelet measures none of its volumes (MetricsNil).
				continue
			}
			s := v.Name
			if c := v.PersistentVolumeClaim; c != nil {
				s += " claim " + pod.Namespace + "/" + c.ClaimName
			}
			want[pod.Name] = append(want[pod.Name], s+" used")
		}
		slices.Sort(want[pod.Name])
	}
	ctx, cancel := context.WithTimeout(e.t.Context(), 2*time.Minute)
	defer cancel()
	var got map[string][]string
	var last error
	err := p.WaitFor(ctx, "the round's pods' volumes in the fork's stats summary", func() bool {
		s, err := e.summary(ctx)
		if err != nil {
			last = err
			return false
		}
		got = map[string][]string{}
		for _, ps := range s.Pods {
			if ps.PodRef.Namespace != e2eNS || !strings.HasSuffix(ps.PodRef.Name, r.suffix) {
				continue
			}
			for _, v := range ps.Volumes {
				got[ps.PodRef.Name] = append(got[ps.PodRef.Name], v.String())
			}
			slices.Sort(got[ps.PodRef.Name])
		}
		for name, vols := range want {
			if !slices.Equal(got[name], vols) {
				return false
			}
		}
		return true
	})
	if err != nil {
		e.t.Fatalf("%v\ngot  %q\nwant %q\nlast error: %v", err, got, want, last)
	}
	e.t.Logf("round %s: the fork's stats summary lists %q", r.suffix, got)
}

// summary reads the fork's /stats/summary at its port (the Node's
// daemonEndpoints), anonymously (startForkEnv's --anonymous-auth), its
// serving certificate self-signed.
func (e *forkEnv) summary(ctx context.Context) (*summary, error) {
	node, err := e.admin.CoreV1().Nodes().Get(ctx, e2eNode, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	url := fmt.Sprintf("https://127.0.0.1:%d/stats/summary", node.Status.DaemonEndpoints.KubeletEndpoint.Port)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	var s summary
	if err := json.Unmarshal(body, &s); err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	return &s, nil
}

// fakeContainerStats gives the fake runtime the stats of each of its
// containers and of an image file system (it has none of its own): the
// kubelet lists in its summary only the pods of containers with stats,
// and fails the summary without an image file system.
func (e *forkEnv) fakeContainerStats() {
	rt := e.kubelet.Runtime
	if rt == nil {
		return
	}
	now := time.Now().UnixNano()
	rt.ImageService.SetFakeFilesystemUsage([]*runtimeapi.FilesystemUsage{{Timestamp: now,
		UsedBytes: &runtimeapi.UInt64Value{Value: 4 << 20}, InodesUsed: &runtimeapi.UInt64Value{Value: 1}}})
	rs := rt.RuntimeService
	rs.Lock()
	var stats []*runtimeapi.ContainerStats
	for id, c := range rs.Containers {
		stats = append(stats, &runtimeapi.ContainerStats{
			Attributes: &runtimeapi.ContainerAttributes{Id: id, Metadata: c.Metadata, Labels: c.Labels, Annotations: c.Annotations},
			Cpu:        &runtimeapi.CpuUsage{Timestamp: now, UsageCoreNanoSeconds: &runtimeapi.UInt64Value{Value: 1}},
			Memory:     &runtimeapi.MemoryUsage{Timestamp: now, WorkingSetBytes: &runtimeapi.UInt64Value{Value: 1 << 20}},
		})
	}
	rs.Unlock()
	rs.SetFakeContainerStats(stats)
}
