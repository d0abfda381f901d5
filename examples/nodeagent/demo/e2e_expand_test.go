package main

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/roottest"
	"github.com/nodevol/nodevol/volumemanager"
)

// TestOnlineExpansionEndToEnd grows a mounted volume of the loop driver:
// the controller part by hand (ControllerExpandVolume, the PV's capacity,
// the claim's FileSystemResizePending), the node part by nodevol
// (NodeExpandVolume: the loop device and the filesystem grow while
// mounted), which then records the new size on the claim. It uses XFS:
// growing a mounted ext4 needs CAP_SYS_RESOURCE, which containers (CI's
// machines among them) often lack; xfs_growfs needs CAP_SYS_ADMIN only.
func TestOnlineExpansionEndToEnd(t *testing.T) {
	roottest.Require(t)
	const node = "node-1"
	root, err := csitest.ShortTempDir("nv-exp-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(root)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	drv, err := startDemoDriver(ctx, root, node)
	if err != nil {
		t.Fatal(err)
	}
	defer drv.stop()
	conn, err := grpc.NewClient("unix://"+drv.endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctrl := csi.NewControllerClient(conn)
	mountCap := []*csi.VolumeCapability{{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "xfs"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}}
	vol, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "grow", CapacityRange: &csi.CapacityRange{RequiredBytes: 320 << 20}, VolumeCapabilities: mountCap})
	if err != nil {
		t.Fatal(err)
	}
	pvc, pv := csitest.BoundClaim("demo", "grow", csitest.PVSpec{Driver: drv.name, Handle: vol.GetVolume().GetVolumeId(), FSType: "xfs", Capacity: "320Mi"})
	pvc.Status.Capacity = v1.ResourceList{v1.ResourceStorage: resource.MustParse("320Mi")}
	client := fake.NewClientset(csitest.CSIDriver(drv.name, csitest.CSIDriverSpec{}), pvc, pv)
	vm, err := volumemanager.New(volumemanager.Config{NodeName: node, KubeClient: client, RootDir: root, Mounter: drv.mounter})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopRun := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- vm.Run(runCtx) }()
	defer func() { stopRun(); <-ran }()
	if err := vm.Drivers().Register(ctx, drv.name, drv.endpoint); err != nil {
		t.Fatal(err)
	}
	pod := csitest.Pod("demo", "grow", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "grow"}}})
	path, err := mountAndUse(ctx, vm, pod)
	if err != nil {
		t.Fatal(err)
	}
	before := fsSize(t, path)

	// The external-resizer's part.
	if _, err := ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{
		VolumeId: vol.GetVolume().GetVolumeId(), CapacityRange: &csi.CapacityRange{RequiredBytes: 512 << 20}, VolumeCapability: mountCap[0],
	}); err != nil {
		t.Fatal(err)
	}
	pv.Spec.Capacity[v1.ResourceStorage] = resource.MustParse("512Mi")
	if _, err := client.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pvc.Status.Conditions = []v1.PersistentVolumeClaimCondition{{Type: v1.PersistentVolumeClaimFileSystemResizePending, Status: v1.ConditionTrue}}
	if _, err := client.CoreV1().PersistentVolumeClaims("demo").UpdateStatus(ctx, pvc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	eventually(t, ctx, "claim reports 512Mi", func() (bool, error) {
		c, err := client.CoreV1().PersistentVolumeClaims("demo").Get(ctx, "grow", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		got := c.Status.Capacity[v1.ResourceStorage]
		return got.Cmp(resource.MustParse("512Mi")) == 0 && len(c.Status.Conditions) == 0, nil
	})
	if after := fsSize(t, path); after < before+150<<20 || after > 512<<20 {
		t.Errorf("filesystem at %s: %d bytes before, %d after; want about 512 MiB", path, before, after)
	}
	if data, err := os.ReadFile(path + "/hello.txt"); err != nil || string(data) != "hello from grow\n" {
		t.Errorf("data after the expansion: %q, %v", data, err)
	}
	deletePods(t, ctx, vm, []*v1.Pod{pod})
	if err := waitUnstaged(ctx, vm); err != nil {
		t.Fatal(err)
	}
	assertClean(t, drv, root)
}

func fsSize(t *testing.T, path string) uint64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * uint64(st.Bsize)
}
