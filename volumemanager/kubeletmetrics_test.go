package volumemanager

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/ondisk"
)

// samples gathers reg and returns the samples of the named families, one
// line each, `name{label="value",...} value`, sorted: what an exact
// comparison needs, without a text-format dependency.
func samples(t *testing.T, reg prometheus.Gatherer, names ...string) string {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, f := range fams {
		if !slices.Contains(names, f.GetName()) {
			continue
		}
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			v := m.GetGauge().GetValue()
			if m.GetCounter() != nil {
				v = m.GetCounter().GetValue()
			}
			lines = append(lines, fmt.Sprintf("%s{%s} %g", f.GetName(), strings.Join(labels, ","), v))
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// TestTotalVolumesMetric: volume_manager_total_volumes counts, as the
// kubelet does, a (pod, volume) pair per pod that wants a volume and per
// pod that has it mounted, by plugin kubernetes.io/csi:{driver}.
func TestTotalVolumesMetric(t *testing.T) {
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
	pvcA, pvA := csitest.BoundClaim("ns", "a", csitest.PVSpec{
		Driver:      drv.DriverName(),
		Handle:      "handle-a",
		AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteMany},
	})
	pvcB, pvB := csitest.BoundClaim("ns", "b", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-b"})
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{}), pvcA, pvA, pvcB, pvB)
	reg := prometheus.NewRegistry()
	vm, stop := startVMWith(t, Config{NodeName: node, KubeClient: client, RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil), Registerer: reg}, drv)
	defer stop()
	const fam = "volume_manager_total_volumes"
	if got := samples(t, reg, fam); got != "" {
		t.Errorf("before any pod:\n%s\nwant nothing", got)
	}
	p1 := csitest.Pod("ns", "p1", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "a"}}})
	p2 := csitest.Pod("ns", "p2", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "a", ReadOnly: true}}})
	p3 := csitest.Pod("ns", "p3", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "b"}}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, p := range []*v1.Pod{p1, p2, p3} {
		vm.AddPod(p)
		if err := vm.WaitForAttachAndMount(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	plugin := "kubernetes.io/csi:" + drv.DriverName()
	want := fmt.Sprintf("%[1]s{plugin_name=%[2]q,state=\"actual_state_of_world\"} 3\n%[1]s{plugin_name=%[2]q,state=\"desired_state_of_world\"} 3", fam, plugin)
	if got := samples(t, reg, fam); got != want {
		t.Errorf("three pods mounted:\n%s\nwant\n%s", got, want)
	}
	vm.DeletePod(p3)
	if err := vm.WaitForUnmount(ctx, p3); err != nil {
		t.Fatal(err)
	}
	want = fmt.Sprintf("%[1]s{plugin_name=%[2]q,state=\"actual_state_of_world\"} 2\n%[1]s{plugin_name=%[2]q,state=\"desired_state_of_world\"} 2", fam, plugin)
	if got := samples(t, reg, fam); got != want {
		t.Errorf("after p3 went:\n%s\nwant\n%s", got, want)
	}
}

// TestReconstructMetrics: reconstruct_volume_operations_total counts every
// pod volume found on disk at start, _errors_total those that could not be
// reconstructed (here a corrupt vol_data.json).
func TestReconstructMetrics(t *testing.T) {
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
	pvcA, pvA := csitest.BoundClaim("ns", "a", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-a"})
	pvcB, pvB := csitest.BoundClaim("ns", "b", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-b"})
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{}), pvcA, pvA, pvcB, pvB)
	root := t.TempDir()
	vm1, stop1 := startVM(t, client, root, drv)
	for _, p := range []*v1.Pod{csitest.Pod("ns", "a", csitest.PodSpec{Volumes: []csitest.PodVolume{
		{Name: "data", Claim: "a"},
	}}), csitest.Pod("ns", "b", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "b"}}})} {
		vm1.AddPod(p)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := vm1.WaitForAttachAndMount(ctx, p)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	stop1()
	// With a file in mount/: a directory that cannot hold data would be
	// removed rather than left.
	corrupt := filepath.Join(root, "pods", "junk-uid", "volumes", "kubernetes.io~csi", "junk")
	if err := os.MkdirAll(filepath.Join(corrupt, "mount"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(corrupt, "mount", "data"), []byte("data"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(corrupt, ondisk.VolumeDataFile), []byte("{garbage"), 0o640); err != nil {
		t.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	_, stop2 := startVMWith(t, Config{NodeName: node, KubeClient: client, RootDir: root, Mounter: mount.NewFakeMounter(nil), Registerer: reg}, drv)
	defer stop2()
	want := "reconstruct_volume_operations_errors_total{} 1\nreconstruct_volume_operations_total{} 3"
	if got := samples(t, reg, "reconstruct_volume_operations_total", "reconstruct_volume_operations_errors_total"); got != want {
		t.Errorf("reconstruction counters:\n%s\nwant\n%s", got, want)
	}
}

// TestFailureEvents: a raw block volume whose publish fails gets
// FailedMapVolume on its pod, a volume whose unpublish fails
// FailedUnMount, each in the kubelet's words with the driver's error
// (for the unpublish, as the kubelet's CSI plugin wraps it).
func TestFailureEvents(t *testing.T) {
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
	pvcRaw, pvRaw := csitest.BoundClaim("ns", "raw", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-raw", Block: true})
	pvcFS, pvFS := csitest.BoundClaim("ns", "fs", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-fs"})
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{}), pvcRaw, pvRaw, pvcFS, pvFS)
	events := record.NewFakeRecorder(10)
	vm, stop := startVMWith(t, Config{NodeName: node, KubeClient: client, RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil),
		BlockMapper: &recordingBlockMapper{}, EventRecorder: events}, drv)
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	drv.Inject(csitest.Fault{Method: "NodePublishVolume", VolumeID: "handle-raw", Err: status.Error(codes.Internal, "no such device"), Times: 1})
	raw := csitest.Pod("ns", "raw", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "dev", Claim: "raw", Block: true}}})
	vm.AddPod(raw)
	ev := nextEvent(t, events)
	if want := `Warning FailedMapVolume MapVolume.MapPodDevice failed for volume "` + pvRaw.Name + `" : rpc error: code = Internal desc = no such device`; ev != want {
		t.Errorf("event %q\nwant  %q", ev, want)
	}
	if err := vm.WaitForAttachAndMount(ctx, raw); err != nil { // retried after the backoff
		t.Fatal(err)
	}

	fs := csitest.Pod("ns", "fs", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "fs"}}})
	vm.AddPod(fs)
	if err := vm.WaitForAttachAndMount(ctx, fs); err != nil {
		t.Fatal(err)
	}
	drv.Inject(csitest.Fault{Method: "NodeUnpublishVolume", VolumeID: "handle-fs", Err: status.Error(codes.Internal, "device busy"), Times: 1})
	vm.DeletePod(fs)
	ev = nextEvent(t, events)
	if want := `Warning FailedUnMount UnmountVolume.TearDown failed for volume "kubernetes.io/csi/` + drv.DriverName() +
		`^handle-fs" : kubernetes.io/csi: Unmounter.TearDownAt failed: rpc error: code = Internal desc = device busy`; ev != want {
		t.Errorf("event %q\nwant  %q", ev, want)
	}
	if err := vm.WaitForUnmount(ctx, fs); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-events.Events:
		t.Errorf("unexpected event %q", ev)
	default:
	}
}

func nextEvent(t *testing.T, events *record.FakeRecorder) string {
	t.Helper()
	select {
	case ev := <-events.Events:
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no event")
		return ""
	}
}
