package volumemanager

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/podvol"
)

// TestMarkVolumesAsReportedInUse: with VolumesInUseReportedByCaller, an
// attach-required volume whose VolumeAttachment is attached is neither
// confirmed attached nor staged until MarkVolumesAsReportedInUse names it;
// a call that names other volumes does not release it; once named, it
// mounts. The manager never patches the Node itself in this mode.
func TestMarkVolumesAsReportedInUse(t *testing.T) {
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
	pvc, pv := csitest.BoundClaim("ns", "a", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-a"})
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{AttachRequired: true}), pvc, pv, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	csitest.NewFakeAttacher(t, client, csitest.AttacherOptions{})
	va, err := csitest.AttachVolume(ctx, client, pv, node)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "VolumeAttachment attached", func() bool {
		got, err := client.StorageV1().VolumeAttachments().Get(ctx, va.Name, metav1.GetOptions{})
		return err == nil && got.Status.Attached
	})
	vm, stop := startVMWith(t, Config{NodeName: node, KubeClient: client, RootDir: t.TempDir(),
		Mounter: mount.NewFakeMounter(nil), VolumesInUseReportedByCaller: true}, drv)
	defer stop()
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "a"}}})
	name := podvol.CSIVolumeName(drv.DriverName(), "handle-a")
	vm.AddPod(pod)
	eventually(t, "the pod's volume desired", func() bool { return slices.Contains(vm.GetVolumesInUse(), name) })
	waitIdle(t, vm)
	vm.MarkVolumesAsReportedInUse([]podvol.UniqueVolumeName{"kubernetes.io/csi/other^handle"})
	waitIdle(t, vm)
	if vm.VolumeIsAttached(name) {
		t.Error("VolumeIsAttached before the volume was reported in use")
	}
	if n := drv.Calls("NodeStageVolume"); n != 0 {
		t.Fatalf("NodeStageVolume called %d times before the volume was reported in use", n)
	}
	short, stopWait := context.WithTimeout(ctx, 50*time.Millisecond)
	err = vm.WaitForAttachAndMount(short, pod)
	stopWait()
	if err == nil || !strings.Contains(err.Error(), "status.volumesInUse") {
		t.Errorf("WaitForAttachAndMount = %v; want it to say the volume waits for status.volumesInUse", err)
	}

	vm.MarkVolumesAsReportedInUse([]podvol.UniqueVolumeName{name})
	if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if !vm.VolumeIsAttached(name) {
		t.Error("VolumeIsAttached = false for a mounted attach-required volume")
	}
	if vm.VolumeIsAttached("kubernetes.io/csi/other^handle") {
		t.Error("VolumeIsAttached = true for an unknown volume")
	}
	// Leaving the list does not detach what is attached (as in the kubelet).
	vm.MarkVolumesAsReportedInUse(nil)
	waitIdle(t, vm)
	if !vm.VolumeIsAttached(name) || len(vm.GetMountedVolumesForPod(pod.UID)) != 1 {
		t.Error("the volume was torn down or unattached when it left the reported list")
	}
	for _, a := range client.Actions() {
		if a.GetResource().Resource == "nodes" && a.GetVerb() == "patch" {
			t.Errorf("the manager patched the Node (%v) although the caller reports volumes in use", a)
		}
	}
}

// TestMarkVolumesAsReportedInUseIgnored: without
// VolumesInUseReportedByCaller the call holds nothing back (nothing gates
// the attach) and releases nothing (ReportVolumesInUse: the manager's own
// report decides); setting both modes is refused.
func TestMarkVolumesAsReportedInUseIgnored(t *testing.T) {
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
	pvc, pv := csitest.BoundClaim("ns", "a", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-a"})
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{AttachRequired: true}), pvc, pv)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	csitest.NewFakeAttacher(t, client, csitest.AttacherOptions{})
	if _, err := csitest.AttachVolume(ctx, client, pv, node); err != nil {
		t.Fatal(err)
	}
	vm, stop := startVM(t, client, t.TempDir(), drv)
	defer stop()
	vm.MarkVolumesAsReportedInUse(nil)
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "a"}}})
	vm.AddPod(pod)
	if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}

	_, err := New(Config{NodeName: node, KubeClient: client, ReportVolumesInUse: true, VolumesInUseReportedByCaller: true})
	if err == nil || !strings.Contains(err.Error(), "exclusive") {
		t.Errorf("New with both volumes-in-use modes = %v, want an error saying they are exclusive", err)
	}
}

// TestReconcilerStatesHasBeenSynced: false before Run; true once Run has
// read the disk and made its first pass, and by then a volume an earlier
// run left mounted is known (possibly mounted) without its pod having been
// added.
func TestReconcilerStatesHasBeenSynced(t *testing.T) {
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
	pvc, pv := csitest.BoundClaim("ns", "a", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-a"})
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{}), pvc, pv)
	root := t.TempDir()
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "a"}}})
	vm1, stop1 := startVM(t, client, root, drv)
	vm1.AddPod(pod)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := vm1.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	stop1()

	vm2, err := New(Config{NodeName: node, KubeClient: client, RootDir: root, Mounter: mount.NewFakeMounter(nil)})
	if err != nil {
		t.Fatal(err)
	}
	if vm2.ReconcilerStatesHasBeenSynced() {
		t.Error("ReconcilerStatesHasBeenSynced before Run")
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- vm2.Run(runCtx) }()
	defer func() { stop(); <-done }()
	eventually(t, "states synced", vm2.ReconcilerStatesHasBeenSynced)
	got := vm2.GetPossiblyMountedVolumesForPod(pod.UID)
	if name := podvol.CSIVolumeName(drv.DriverName(), "handle-a"); len(got) != 1 || got[0].Name != name || got[0].State != podvol.Uncertain {
		t.Errorf("possibly mounted volumes of the earlier run's pod = %+v, want %s, Uncertain", got, name)
	}
	if len(vm2.GetMountedVolumesForPod(pod.UID)) != 0 {
		t.Error("an Uncertain reconstructed volume counted as mounted")
	}
}

// TestVolumeIsAttachedWithoutAttach: a mounted volume of a driver that
// needs no attach is attached, as the kubelet's VolumeIsAttached says of
// every volume its actual state holds.
func TestVolumeIsAttachedWithoutAttach(t *testing.T) {
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
	pvc, pv := csitest.BoundClaim("ns", "a", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-a"})
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{}), pvc, pv, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}})
	vm, stop := startVMWith(t, Config{NodeName: node, KubeClient: client, RootDir: t.TempDir(),
		Mounter: mount.NewFakeMounter(nil), VolumesInUseReportedByCaller: true}, drv)
	defer stop()
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "a"}}})
	name := podvol.CSIVolumeName(drv.DriverName(), "handle-a")
	if vm.VolumeIsAttached(name) {
		t.Error("VolumeIsAttached before any pod wants the volume")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := vm.AddPod(pod); err != nil {
		t.Fatal(err)
	}
	if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if !vm.VolumeIsAttached(name) {
		t.Error("VolumeIsAttached = false for a mounted volume that needs no attach")
	}
}
