package volumemanager

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// histogramCounts returns the sample count of each series of the
// histogram family name, keyed by its labels.
func histogramCounts(t *testing.T, reg prometheus.Gatherer, name string) map[string]uint64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			out[strings.Join(labels, ",")] = m.GetHistogram().GetSampleCount()
		}
	}
	return out
}

// TestTwoManagersShareRegisterer: a second New on a registerer that
// already holds the first manager's collectors works, and both count into
// the same families: operation durations and CSI calls add up, volume
// counts are summed, and the registry gathers without duplicate series.
func TestTwoManagersShareRegisterer(t *testing.T) {
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
	pvcA, pvA := csitest.BoundClaim("ns", "a", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-a"})
	pvcB, pvB := csitest.BoundClaim("ns", "b", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-b"})
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{}), pvcA, pvA, pvcB, pvB)
	reg := prometheus.NewRegistry()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, claim := range []string{"a", "b"} {
		vm, stop := startVMWith(t, Config{NodeName: node, KubeClient: client, RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil), Registerer: reg}, drv)
		defer stop()
		pod := csitest.Pod("ns", "p-"+claim, csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: claim}}})
		vm.AddPod(pod)
		if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
			t.Fatal(err)
		}
	}
	plugin := "kubernetes.io/csi:" + drv.DriverName()
	const fam = "volume_manager_total_volumes"
	want := fmt.Sprintf("%[1]s{plugin_name=%[2]q,state=\"actual_state_of_world\"} 2\n%[1]s{plugin_name=%[2]q,state=\"desired_state_of_world\"} 2", fam, plugin)
	if got := samples(t, reg, fam); got != want {
		t.Errorf("two managers with a pod each:\n%s\nwant\n%s", got, want)
	}
	ops := histogramCounts(t, reg, "storage_operation_duration_seconds")
	for _, op := range []string{"verify_controller_attached_volume", "volume_mount"} {
		k := fmt.Sprintf("migrated=\"false\",operation_name=%q,status=\"success\",volume_plugin=%q", op, plugin)
		if ops[k] != 2 {
			t.Errorf("storage_operation_duration_seconds{%s} count = %d, want 2 (one per manager); all: %v", k, ops[k], ops)
		}
	}
	calls := histogramCounts(t, reg, "csi_operations_seconds")
	k := fmt.Sprintf("driver_name=%q,grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodePublishVolume\",migrated=\"false\"", drv.DriverName())
	if calls[k] != 2 {
		t.Errorf("csi_operations_seconds{%s} count = %d, want 2; all: %v", k, calls[k], calls)
	}
}

// kubeletHistogramVec stands for the kubelet's own collector of
// storage_operation_duration_seconds: k8s.io/component-base's HistogramVec
// embeds the prometheus one and shadows WithLabelValues with its own
// return type, and its help text carries the stability level, BETA since
// Kubernetes 1.37.
type kubeletHistogramVec struct {
	*prometheus.HistogramVec
}

func (v *kubeletHistogramVec) WithLabelValues(lvs ...string) interface{ Observe(float64) } {
	return v.HistogramVec.WithLabelValues(lvs...)
}

// TestKubeletOperationMetricShared: in a fork whose registerer already
// holds the kubelet 1.37's storage_operation_duration_seconds (same name,
// labels, buckets and help), New works and the manager's operations are
// counted in the kubelet's collector. A collector of that name with
// another shape is a clear error from New.
func TestKubeletOperationMetricShared(t *testing.T) {
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
	pvc, pv := csitest.BoundClaim("ns", "a", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-a"})
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{}), pvc, pv)
	reg := prometheus.NewRegistry()
	kubelet := &kubeletHistogramVec{prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "storage_operation_duration_seconds",
		Help:    "[BETA] Storage operation duration",
		Buckets: []float64{.1, .25, .5, 1, 2.5, 5, 10, 15, 25, 50, 120, 300, 600},
	}, []string{"volume_plugin", "operation_name", "status", "migrated"})}
	reg.MustRegister(kubelet)
	kubelet.WithLabelValues("kubernetes.io/csi:other", "volume_mount", "success", "false").Observe(1) // the kubelet's own

	vm, stop := startVMWith(t, Config{NodeName: node, KubeClient: client, RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil), Registerer: reg}, drv)
	defer stop()
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "a"}}})
	vm.AddPod(pod)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	var own, kubelets uint64
	ch := make(chan prometheus.Metric, 100)
	kubelet.Collect(ch)
	close(ch)
	for m := range ch {
		d := new(dto.Metric)
		if err := m.Write(d); err != nil {
			t.Fatal(err)
		}
		for _, l := range d.GetLabel() {
			if l.GetName() == "volume_plugin" {
				if l.GetValue() == "kubernetes.io/csi:"+drv.DriverName() {
					own += d.GetHistogram().GetSampleCount()
				} else {
					kubelets += d.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	if own == 0 || kubelets != 1 {
		t.Errorf("the kubelet's collector holds %d samples of the manager's operations and %d of its own; want some and 1", own, kubelets)
	}

	other := prometheus.NewRegistry()
	other.MustRegister(prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "storage_operation_duration_seconds", Help: "[BETA] Storage operation duration",
	}, []string{"volume_plugin", "operation_name"}))
	_, err := New(Config{NodeName: node, KubeClient: client, RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil), Registerer: other})
	if err == nil || !strings.Contains(err.Error(), "storage_operation_duration_seconds") {
		t.Errorf("New on a registerer with another storage_operation_duration_seconds = %v, want an error naming it", err)
	}
}
