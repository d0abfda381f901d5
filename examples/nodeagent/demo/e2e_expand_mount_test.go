package main

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/roottest"
	"github.com/nodevol/nodevol/volumemanager"
)

// resizerMarks does the external-resizer's part after
// ControllerExpandVolume: the PV's capacity becomes size and the claim asks
// the node for the rest (NodeResizePending and FileSystemResizePending, as
// the resizer of Kubernetes 1.33 leaves it).
func resizerMarks(t *testing.T, ctx context.Context, client kubernetes.Interface, pvName, ns, claim, size string) {
	t.Helper()
	pv, err := client.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv.Spec.Capacity[v1.ResourceStorage] = resource.MustParse(size)
	if _, err := client.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pvc, err := client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pvc.Status.AllocatedResourceStatuses = map[v1.ResourceName]v1.ClaimResourceStatus{v1.ResourceStorage: v1.PersistentVolumeClaimNodeResizePending}
	pvc.Status.Conditions = []v1.PersistentVolumeClaimCondition{{Type: v1.PersistentVolumeClaimFileSystemResizePending, Status: v1.ConditionTrue}}
	if _, err := client.CoreV1().PersistentVolumeClaims(ns).UpdateStatus(ctx, pvc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// claimDone reports whether the claim records size as its capacity with
// nothing of the resize left in its status.
func claimDone(ctx context.Context, client kubernetes.Interface, ns, claim, size string) (bool, error) {
	c, err := client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim, metav1.GetOptions{})
	if err != nil {
		return false, err
	}
	got := c.Status.Capacity[v1.ResourceStorage]
	return got.Cmp(resource.MustParse(size)) == 0 && len(c.Status.Conditions) == 0 && c.Status.AllocatedResourceStatuses == nil, nil
}

// TestExpandWhileMountingEndToEnd: the controller grows a volume of the
// loop driver while no pod uses it (its XFS was made at 320 MiB by a first
// pod); the next pod's mount grows the file system before
// WaitForAttachAndMount returns: the pod sees 512 MiB at once, with the
// first pod's data, and the claim records the new size.
func TestExpandWhileMountingEndToEnd(t *testing.T) {
	roottest.Require(t)
	const node = "node-1"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	root, drv := startE2E(t, ctx, "nv-expm-", node)
	conn, err := grpc.NewClient("unix://"+drv.endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctrl := csi.NewControllerClient(conn)
	mountCap := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "xfs"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	vol, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "offline", CapacityRange: &csi.CapacityRange{RequiredBytes: 320 << 20}, VolumeCapabilities: []*csi.VolumeCapability{mountCap}})
	if err != nil {
		t.Fatal(err)
	}
	id := vol.GetVolume().GetVolumeId()
	pvc, pv := csitest.BoundClaim("demo", "offline", csitest.PVSpec{Driver: drv.name, Handle: id, FSType: "xfs", Capacity: "320Mi"})
	pvc.Status.Capacity = v1.ResourceList{v1.ResourceStorage: resource.MustParse("320Mi")}
	client := fake.NewClientset(csitest.CSIDriver(drv.name, csitest.CSIDriverSpec{}), pvc, pv)
	vm := runVolumeManager(t, ctx, volumemanager.Config{NodeName: node, KubeClient: client, RootDir: root, Mounter: drv.mounter}, drv.name, drv.endpoint)

	first := csitest.Pod("demo", "first", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "offline"}}})
	path, err := mountAndUse(ctx, vm, first)
	if err != nil {
		t.Fatal(err)
	}
	before := fsSize(t, path)
	deletePods(t, ctx, vm, []*v1.Pod{first})
	if err := waitUnstaged(ctx, vm); err != nil {
		t.Fatal(err)
	}

	if _, err := ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 512 << 20}, VolumeCapability: mountCap}); err != nil {
		t.Fatal(err)
	}
	resizerMarks(t, ctx, client, pv.Name, "demo", "offline", "512Mi")

	second := csitest.Pod("demo", "second", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "offline"}}})
	vm.AddPod(second)
	if err := vm.WaitForAttachAndMount(ctx, second); err != nil {
		t.Fatal(err)
	}
	vols := vm.GetMountedVolumesForPod(second.UID)
	if len(vols) != 1 {
		t.Fatalf("mounted volumes of the second pod: %+v", vols)
	}
	// At once: the pod may start now, so the file system must have grown.
	if after := fsSize(t, vols[0].Path); after < before+150<<20 || after > 512<<20 {
		t.Errorf("file system the second pod starts with: %d bytes, was %d; want about 512 MiB", after, before)
	}
	if data, err := os.ReadFile(vols[0].Path + "/hello.txt"); err != nil || string(data) != "hello from first\n" {
		t.Errorf("the first pod's data after the expansion: %q, %v", data, err)
	}
	eventually(t, ctx, "claim reports 512Mi", func() (bool, error) { return claimDone(ctx, client, "demo", "offline", "512Mi") })

	deletePods(t, ctx, vm, []*v1.Pod{second})
	if err := waitUnstaged(ctx, vm); err != nil {
		t.Fatal(err)
	}
	assertClean(t, drv, root)
}

// TestBlockExpansionEndToEnd grows a raw block volume of the loop driver
// while a pod has it mapped: ControllerExpandVolume grows the image, and
// nodevol's NodeExpandVolume (publish path, block capability) makes the
// driver's loop device pick it up: the pod's device grows from 16 to 32 MiB
// (blockdev --getsize64), with its data, and the claim records the size.
func TestBlockExpansionEndToEnd(t *testing.T) {
	roottest.Require(t)
	const node = "node-1"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	root, drv := startE2E(t, ctx, "nv-blkexp-", node)
	conn, err := grpc.NewClient("unix://"+drv.endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctrl := csi.NewControllerClient(conn)
	blockCap := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	vol, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "rawgrow", CapacityRange: &csi.CapacityRange{RequiredBytes: 16 << 20}, VolumeCapabilities: []*csi.VolumeCapability{blockCap}})
	if err != nil {
		t.Fatal(err)
	}
	id := vol.GetVolume().GetVolumeId()
	pvc, pv := csitest.BoundClaim("demo", "rawgrow", csitest.PVSpec{Driver: drv.name, Handle: id, Block: true, Capacity: "16Mi"})
	pvc.Status.Capacity = v1.ResourceList{v1.ResourceStorage: resource.MustParse("16Mi")}
	client := fake.NewClientset(csitest.CSIDriver(drv.name, csitest.CSIDriverSpec{}), pvc, pv)
	vm := runVolumeManager(t, ctx, volumemanager.Config{NodeName: node, KubeClient: client, RootDir: root, Mounter: drv.mounter}, drv.name, drv.endpoint)

	pod := csitest.Pod("demo", "raw", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "raw", Claim: "rawgrow", Block: true}}})
	vm.AddPod(pod)
	if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	vols := vm.GetMountedVolumesForPod(pod.UID)
	if len(vols) != 1 {
		t.Fatalf("mapped volumes: %+v", vols)
	}
	dev := vols[0].Path
	if got := blockSize(t, dev); got != 16<<20 {
		t.Fatalf("%s: %d bytes before the expansion, want 16 MiB", dev, got)
	}
	want := []byte("block data before the expansion")
	writeAt(t, dev, want)

	if _, err := ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 32 << 20}, VolumeCapability: blockCap}); err != nil {
		t.Fatal(err)
	}
	resizerMarks(t, ctx, client, pv.Name, "demo", "rawgrow", "32Mi")
	eventually(t, ctx, "claim reports 32Mi", func() (bool, error) { return claimDone(ctx, client, "demo", "rawgrow", "32Mi") })
	if got := blockSize(t, dev); got != 32<<20 {
		t.Errorf("%s: %d bytes after the expansion, want 32 MiB", dev, got)
	}
	if got := readAt(t, dev, len(want)); string(got) != string(want) {
		t.Errorf("data after the expansion: %q, want %q", got, want)
	}

	deletePods(t, ctx, vm, []*v1.Pod{pod})
	if err := waitUnstaged(ctx, vm); err != nil {
		t.Fatal(err)
	}
	assertClean(t, drv, root)
}

// blockSize is blockdev --getsize64 of the device at path.
func blockSize(t *testing.T, path string) int64 {
	t.Helper()
	out, err := exec.Command("blockdev", "--getsize64", path).CombinedOutput()
	if err != nil {
		t.Fatalf("blockdev --getsize64 %s: %v: %s", path, err, out)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
