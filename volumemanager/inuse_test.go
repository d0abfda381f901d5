package volumemanager

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/podvol"
)

// TestReportVolumesInUse: with ReportVolumesInUse, a volume that needs
// attaching is not confirmed attached (nor staged) before the Node's
// status.volumesInUse lists it; once the Node can be patched it is
// reported, mounted, and after the pod goes and the volume is unstaged,
// no longer reported.
func TestReportVolumesInUse(t *testing.T) {
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
	pvc, pv := csitest.BoundClaim("ns", "a", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-a"})
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{AttachRequired: true}), pvc, pv, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}})
	var refuse atomic.Bool
	refuse.Store(true)
	client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if refuse.Load() {
			return true, nil, errors.New("API server unavailable")
		}
		return false, nil, nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	csitest.NewFakeAttacher(t, client, csitest.AttacherOptions{})
	if _, err := csitest.AttachVolume(ctx, client, pv, node); err != nil { // the attach/detach controller's part
		t.Fatal(err)
	}
	vm, err := New(Config{NodeName: node, KubeClient: client, RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil), ReportVolumesInUse: true})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- vm.Run(ctx) }()
	defer func() { cancel(); <-done }()
	if err := vm.Drivers().Register(ctx, drv.DriverName(), drv.Endpoint()); err != nil {
		t.Fatal(err)
	}
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "a"}}})
	vm.AddPod(pod)
	short, stop := context.WithTimeout(ctx, 300*time.Millisecond)
	err = vm.WaitForAttachAndMount(short, pod)
	stop()
	if err == nil {
		t.Fatal("mounted before the volume was reported in use")
	}
	// The wait error says what the volume waits for and why it has not
	// happened: the failed report (not a bare deadline).
	for _, want := range []string{`volume "data"`, "status.volumesInUse", "API server unavailable"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("WaitForAttachAndMount = %v; want it to say %q", err, want)
		}
	}
	if n := drv.Calls("NodeStageVolume"); n != 0 {
		t.Fatalf("NodeStageVolume called %d times before the volume was reported in use", n)
	}

	refuse.Store(false) // the retry reports it, and the mount proceeds
	if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	name := podvol.CSIVolumeName(drv.DriverName(), "handle-a")
	if got := volumesInUse(t, client); !slices.Equal(got, []v1.UniqueVolumeName{v1.UniqueVolumeName(name)}) {
		t.Errorf("Node volumesInUse = %v, want [%s]", got, name)
	}

	vm.DeletePod(pod)
	if err := vm.WaitForUnmount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	eventually(t, "volume no longer reported in use", func() bool { return len(volumesInUse(t, client)) == 0 && len(vm.GetVolumesInUse()) == 0 })
}

func volumesInUse(t *testing.T, client *fake.Clientset) []v1.UniqueVolumeName {
	t.Helper()
	n, err := client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Status.VolumesInUse
}

// knownVolumes returns, sorted, every volume vm's desired or actual state
// knows of, whatever its plugin: what a test waits on to see a volume
// forgotten, where GetVolumesInUse lists only attachable volumes.
func knownVolumes(vm *VolumeManager) []podvol.UniqueVolumeName {
	names := append(vm.dsw.VolumeNames(), vm.asw.VolumeNames()...)
	slices.Sort(names)
	return slices.Compact(names)
}

// TestVolumesInUseOnlyAttachable: GetVolumesInUse lists what the kubelet's
// lists, the volumes whose plugin attaches them (Capabilities.Attachable),
// in the desired state and, after a restart with no pod added yet, in the
// actual state: a PV of a driver that needs attaching is listed; a PV of a
// driver whose CSIDriver says attachRequired: false, an inline CSI volume
// and an emptyDir are not.
func TestVolumesInUseOnlyAttachable(t *testing.T) {
	attached := csitest.New(t, csitest.Options{DriverName: "attached.example.com", CreateTargetDirs: true})
	plain := csitest.New(t, csitest.Options{DriverName: "plain.example.com", CreateTargetDirs: true})
	pvcA, pvA := csitest.BoundClaim("ns", "a", csitest.PVSpec{Driver: attached.DriverName(), Handle: "handle-a"})
	pvcB, pvB := csitest.BoundClaim("ns", "b", csitest.PVSpec{Driver: plain.DriverName(), Handle: "handle-b"})
	client := fake.NewClientset(pvcA, pvA, pvcB, pvB, csitest.CSIDriver(attached.DriverName(), csitest.CSIDriverSpec{AttachRequired: true}),
		csitest.CSIDriver(plain.DriverName(), csitest.CSIDriverSpec{LifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent, storagev1.VolumeLifecycleEphemeral}}))
	csitest.NewFakeAttacher(t, client, csitest.AttacherOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := csitest.AttachVolume(ctx, client, pvA, node); err != nil { // the attach/detach controller's part
		t.Fatal(err)
	}
	root := t.TempDir()
	mounter := mount.NewFakeMounter(nil)
	start := func() (*VolumeManager, func()) {
		vm, stop := startVMWith(t, Config{NodeName: node, KubeClient: client, RootDir: root, Mounter: mounter}, attached)
		if err := vm.Drivers().Register(ctx, plain.DriverName(), plain.Endpoint()); err != nil {
			stop()
			t.Fatal(err)
		}
		return vm, stop
	}
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{
		{Name: "a", Claim: "a"},
		{Name: "b", Claim: "b"},
		{Name: "inline", Source: v1.VolumeSource{CSI: &v1.CSIVolumeSource{Driver: plain.DriverName()}}},
		{Name: "scratch", Source: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
	}})
	nameA := podvol.CSIVolumeName(attached.DriverName(), "handle-a")

	vm, stop := start()
	vm.AddPod(pod)
	if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
		stop()
		t.Fatal(err)
	}
	if known := knownVolumes(vm); len(known) != 4 {
		t.Errorf("known volumes = %v, want the pod's 4", known)
	}
	if got := vm.GetVolumesInUse(); !slices.Equal(got, []podvol.UniqueVolumeName{nameA}) {
		t.Errorf("GetVolumesInUse with the pod mounted = %v, want [%s]", got, nameA)
	}
	stop()

	// Restarted, the pod not added yet: the volumes are only in the actual
	// state, found on disk.
	vm, stop = start()
	defer stop()
	eventually(t, "both PVs reconstructed", func() bool {
		known := knownVolumes(vm)
		return slices.Contains(known, nameA) && slices.Contains(known, podvol.CSIVolumeName(plain.DriverName(), "handle-b"))
	})
	if got := vm.GetVolumesInUse(); !slices.Equal(got, []podvol.UniqueVolumeName{nameA}) {
		t.Errorf("GetVolumesInUse after a restart = %v, want [%s]", got, nameA)
	}
}
