package volumemanager

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"
	"k8s.io/utils/ptr"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// TestMetrics: with a Registerer, the manager reports each operation in
// storage_operation_duration_seconds, each CSI call in
// csi_operations_seconds, and each pod volume mounted in
// volume_operation_total_seconds{operation_name="overall_volume_mount"},
// with the kubelet's names and labels.
func TestMetrics(t *testing.T) {
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
	pvc, pv := csitest.BoundClaim("ns", "a", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-a"})
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{}), pvc, pv)
	prom := prometheus.NewRegistry()
	vm, stop := startVMWith(t, Config{NodeName: node, KubeClient: client, RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil), Registerer: prom}, drv)
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "a"}}})
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
	// attachRequired: false: the planner confirms no attachment, but the
	// kubelet records its verify_controller_attached_volume all the same;
	// its stage is part of its volume_mount, with no series of its own.
	if n := samples["storage_operation_duration_seconds"]["mount_device"]; n != 0 {
		t.Errorf("mount_device: %d samples, want none (the kubelet has no such series)", n)
	}
	for fam, keys := range map[string][]string{
		"storage_operation_duration_seconds": {"verify_controller_attached_volume", "volume_mount"},
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

// TestOperationSeriesOfEachKind: after a pod with a volume of each kind is
// mounted, storage_operation_duration_seconds has the kubelet v1.37.2's
// series for the same pod (its operation_generator.go and the plugins'
// ownership hooks): for every volume verify_controller_attached_volume
// (which only marks a volume that needs no attaching attached) and
// volume_mount (which stages a CSI PV inside it: no mount_device series);
// with an fsGroup, volume_apply_access_control for each volume whose
// files get the group (every kind here; the CSI PV, of fsType ext4 and
// ReadWriteOnce, under the ReadWriteOnceWithFSType policy); nothing else.
func TestOperationSeriesOfEachKind(t *testing.T) {
	for _, fsGroup := range []bool{false, true} {
		t.Run(fmt.Sprintf("fsGroup=%v", fsGroup), func(t *testing.T) { testOperationSeries(t, fsGroup) })
	}
}

func testOperationSeries(t *testing.T, fsGroup bool) {
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
	pvc, pv := csitest.BoundClaim("ns", "a", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-a", FSType: "ext4"})
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{}), pvc, pv,
		&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cm"}, Data: map[string]string{"k": "v"}},
		&v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "sec"}, Data: map[string][]byte{"k": []byte("v")}})
	prom := prometheus.NewRegistry()
	vm, stop := startVMWith(t, Config{NodeName: node, KubeClient: client, RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil), Registerer: prom}, drv)
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mode := int32(0o644)
	name := &v1.ObjectFieldSelector{FieldPath: "metadata.name"}
	spec := csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "a"},
		{Name: "scratch", Source: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
		{Name: "conf", Source: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{
			LocalObjectReference: v1.LocalObjectReference{Name: "cm"}, DefaultMode: &mode}}},
		{Name: "creds", Source: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "sec", DefaultMode: &mode}}},
		{Name: "meta", Source: v1.VolumeSource{DownwardAPI: &v1.DownwardAPIVolumeSource{
			DefaultMode: &mode, Items: []v1.DownwardAPIVolumeFile{{Path: "name", FieldRef: name}}}}},
		{Name: "all", Source: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{DefaultMode: &mode,
			Sources: []v1.VolumeProjection{{DownwardAPI: &v1.DownwardAPIProjection{Items: []v1.DownwardAPIVolumeFile{{Path: "name", FieldRef: name}}}}}}}}}}
	if fsGroup {
		spec.FSGroup = ptr.To[int64](2000)
	}
	pod := csitest.Pod("ns", "p", spec)
	vm.AddPod(pod)
	if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{}
	for _, plugin := range []string{"kubernetes.io/csi:" + drv.DriverName(), "kubernetes.io/empty-dir", "kubernetes.io/configmap",
		"kubernetes.io/secret", "kubernetes.io/downward-api", "kubernetes.io/projected"} {
		ops := []string{"verify_controller_attached_volume", "volume_mount"}
		if fsGroup {
			ops = append(ops, "volume_apply_access_control")
		}
		for _, op := range ops {
			want[fmt.Sprintf("migrated=\"false\",operation_name=%q,status=\"success\",volume_plugin=%q", op, plugin)] = 1
		}
	}
	got := histogramCounts(t, prom, "storage_operation_duration_seconds")
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("storage_operation_duration_seconds series (-the kubelet's +nodevol's):\n%s", diff)
	}
}
