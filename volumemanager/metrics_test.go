package volumemanager

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// TestMetrics: with a Registerer, the manager reports each operation in
// storage_operation_duration_seconds, each CSI call in
// csi_operations_seconds, and each pod volume mounted in
// volume_operation_total_seconds{operation_name="overall_volume_mount"},
// with the kubelet's names and labels.
func TestMetrics(t *testing.T) {
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
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
	fams, err := prom.Gather()
	if err != nil {
		t.Fatal(err)
	}
	samples := map[string]map[string]uint64{} // family -> operation or method -> count
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "operation_name" || l.GetName() == "method_name" {
					if samples[f.GetName()] == nil {
						samples[f.GetName()] = map[string]uint64{}
					}
					samples[f.GetName()][l.GetValue()] += m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	// attachRequired: false: the planner confirms no attachment.
	if n := samples["storage_operation_duration_seconds"]["verify_controller_attached_volume"]; n != 0 {
		t.Errorf("verify_controller_attached_volume: %d samples for a volume that needs no attaching, want 0", n)
	}
	for fam, keys := range map[string][]string{
		"storage_operation_duration_seconds": {"mount_device", "volume_mount"},
		"csi_operations_seconds":             {"/csi.v1.Node/NodeStageVolume", "/csi.v1.Node/NodePublishVolume"},
		"volume_operation_total_seconds":     {"overall_volume_mount"},
	} {
		for _, k := range keys {
			if samples[fam][k] != 1 {
				t.Errorf("%s{%s}: %d samples, want 1 (all: %v)", fam, k, samples[fam][k], samples[fam])
			}
		}
	}
	k := fmt.Sprintf("operation_name=\"overall_volume_mount\",plugin_name=%q", "kubernetes.io/csi:"+drv.DriverName())
	if n := histogramCounts(t, prom, "volume_operation_total_seconds")[k]; n != 1 {
		t.Errorf("volume_operation_total_seconds{%s}: %d samples, want 1", k, n)
	}
}
