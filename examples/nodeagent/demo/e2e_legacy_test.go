package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nodevol/nodevol/csiplugin"
	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/internal/roottest"
	"github.com/nodevol/nodevol/volumemanager"
)

// TestLegacyStagingEndToEnd is a node handed over from an older kubelet
// that staged a volume under plugins/kubernetes.io/csi/pv/{pvName}/globalmount
// and published it into a running pod. nodevol finds both on disk, keeps
// the pod's mount and data (no second stage at the hashed path), and when
// the pod goes unpublishes and unstages from the legacy path, removing its
// directories: nothing is left.
func TestLegacyStagingEndToEnd(t *testing.T) {
	roottest.Require(t)
	const node = "node-1"
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	root, drv := startE2E(t, ctx, "nv-legacy-", node)
	client := fake.NewClientset(csitest.CSIDriver(drv.name, csitest.CSIDriverSpec{}))
	pods, err := provision(ctx, client, drv, 1, node)
	if err != nil {
		t.Fatal(err)
	}
	pod := pods[0]
	pvs, err := client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil || len(pvs.Items) != 1 {
		t.Fatalf("PVs: %v, %v", pvs, err)
	}
	pv := pvs.Items[0]
	handle := pv.Spec.CSI.VolumeHandle

	// The older kubelet's work: stage into the legacy path, publish into
	// the pod, each with its vol_data.json; the pod writes its data.
	legacy := filepath.Join(root, "plugins", "kubernetes.io", "csi", "pv", pv.Name)
	staging := filepath.Join(legacy, "globalmount")
	// The kubelet names a PV's pod directory after the PV.
	podDir := filepath.Join(root, "pods", string(pod.UID), "volumes", "kubernetes.io~csi", pv.Name)
	target := filepath.Join(podDir, "mount")
	for _, d := range []string{staging, podDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	writeVolData(t, legacy, ondisk.VolumeData{SpecVolID: pv.Name, VolumeHandle: handle, DriverName: drv.name})
	writeVolData(t, podDir, ondisk.VolumeData{SpecVolID: pv.Name, VolumeHandle: handle, DriverName: drv.name, NodeName: node,
		AttachmentID: csiplugin.AttachmentName(handle, drv.name, node), VolumeLifecycleMode: string(storagev1.VolumeLifecyclePersistent)})
	conn, err := grpc.NewClient("unix://"+drv.endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	nodeClient := csi.NewNodeClient(conn)
	// ReadWriteOnce, as the kubelet maps it for a driver with
	// SINGLE_NODE_MULTI_WRITER (the loop driver has it): the same
	// capability nodevol sends, or the driver refuses the publish again.
	capability := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER},
	}
	if _, err := nodeClient.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: handle, StagingTargetPath: staging, VolumeCapability: capability}); err != nil {
		t.Fatalf("the older kubelet's NodeStageVolume: %v", err)
	}
	if _, err := nodeClient.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: handle, StagingTargetPath: staging, TargetPath: target, VolumeCapability: capability}); err != nil {
		t.Fatalf("the older kubelet's NodePublishVolume: %v", err)
	}
	const data = "written under the older kubelet\n"
	if err := os.WriteFile(filepath.Join(target, "hello.txt"), []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	stagedBefore := mountInfoUnder(t, root)

	// nodevol takes over.
	vm := runVolumeManager(t, ctx, volumemanager.Config{NodeName: node, KubeClient: client, RootDir: root, Mounter: drv.mounter}, drv.name, drv.endpoint)
	vm.AddPod(pod)
	vm.MarkPodsSynced()
	waitCtx, done := context.WithTimeout(ctx, time.Minute)
	defer done()
	if err := vm.WaitForAttachAndMount(waitCtx, pod); err != nil {
		t.Fatal(err)
	}
	vols := vm.GetMountedVolumesForPod(pod.UID)
	if len(vols) != 1 || vols[0].Path != target {
		t.Fatalf("mounted volumes of the pod: %+v, want one at %s", vols, target)
	}
	if got, err := os.ReadFile(filepath.Join(target, "hello.txt")); err != nil || string(got) != data {
		t.Fatalf("the pod's data after the hand-over: %q, %v", got, err)
	}
	hashed, err := ondisk.StagingDir(root, drv.name, handle)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(hashed); !os.IsNotExist(err) {
		t.Errorf("the volume was staged a second time at %s (%v)", hashed, err)
	}
	after := mountInfoUnder(t, root)
	for _, p := range []string{staging, target} {
		if stagedBefore[p] == "" || after[p] != stagedBefore[p] {
			t.Errorf("mount %s: IDs before %q, after the hand-over %q: want it kept as it was", rel(root, p), stagedBefore[p], after[p])
		}
	}

	deletePods(t, ctx, vm, pods)
	if err := waitUnstaged(ctx, vm); err != nil {
		t.Fatal(err)
	}
	assertClean(t, drv, root)
	if _, err := os.Lstat(legacy); !os.IsNotExist(err) {
		t.Errorf("the legacy staging directory %s is left (%v)", legacy, err)
	}
	if left := mountInfoUnder(t, root); len(left) > 0 {
		t.Errorf("mounts left under the root: %v", left)
	}
}

func writeVolData(t *testing.T, dir string, d ondisk.VolumeData) {
	t.Helper()
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ondisk.VolumeDataFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
}
