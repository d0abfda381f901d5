package volumemanager

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// TestVolumeStats: GetVolumeStats reports a pod's volumes by name; the
// kubelet_volume_stats_* gauges report them by claim, asking the driver
// once per period however often they are scraped.
func TestVolumeStats(t *testing.T) {
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true, GetVolumeStats: true})
	pvc, pv := csitest.BoundClaim("ns", "a", drv.DriverName(), "handle-a")
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), false), pvc, pv)
	prom := prometheus.NewRegistry()
	vm, err := New(Config{NodeName: node, KubeClient: client, RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil), Registerer: prom})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- vm.Run(ctx) }()
	defer func() { cancel(); <-done }()
	if err := vm.Drivers().Register(ctx, drv.DriverName(), drv.Endpoint()); err != nil {
		t.Fatal(err)
	}
	pod := csitest.Pod("ns", "p", csitest.WithPVC("data", "a", false))
	vm.AddPod(pod)
	if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	stats, err := vm.GetVolumeStats(ctx, pod.UID)
	if err != nil {
		t.Fatal(err)
	}
	if s, ok := stats["data"]; !ok || s.CapacityBytes != csitest.DefaultCapacity || s.UsedBytes <= 0 {
		t.Errorf("GetVolumeStats = %+v, want volume data with capacity %d", stats, csitest.DefaultCapacity)
	}
	calls := drv.Calls("NodeGetVolumeStats")
	for i := 0; i < 3; i++ {
		fams, err := prom.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var found bool
		for _, f := range fams {
			if f.GetName() != "kubelet_volume_stats_capacity_bytes" {
				continue
			}
			for _, m := range f.GetMetric() {
				l := map[string]string{}
				for _, p := range m.GetLabel() {
					l[p.GetName()] = p.GetValue()
				}
				found = l["namespace"] == "ns" && l["persistentvolumeclaim"] == "a" && m.GetGauge().GetValue() == float64(csitest.DefaultCapacity)
			}
		}
		if !found {
			t.Fatalf("scrape %d: no kubelet_volume_stats_capacity_bytes{namespace=ns,persistentvolumeclaim=a}", i)
		}
	}
	if got := drv.Calls("NodeGetVolumeStats") - calls; got != 1 {
		t.Errorf("3 scrapes asked the driver %d times, want 1", got)
	}
}
