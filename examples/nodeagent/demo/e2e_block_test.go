package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/roottest"
	"github.com/nodevol/nodevol/volumemanager"
)

// TestBlockEndToEnd maps one raw block volume of the loop driver (RWO:
// SINGLE_NODE_MULTI_WRITER, as the driver can share it on its node) into two
// pods: each sees a block device at its device path; what is written
// through one is read through the other; when both have gone, no loop
// device, bind mount, symlink or directory is left.
func TestBlockEndToEnd(t *testing.T) {
	roottest.Require(t)
	const node = "node-1"
	root, err := csitest.ShortTempDir("nv-blk-")
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
	handle := createBlockVolume(t, ctx, drv, "raw")
	pvc, pv := csitest.BoundClaim("demo", "raw", csitest.PVSpec{
		Driver:      drv.name,
		Handle:      handle,
		Block:       true,
		AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
	})
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

	pods := []*v1.Pod{
		csitest.Pod("demo", "writer", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "raw", Claim: "raw", Block: true}}}),
		csitest.Pod("demo", "reader", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "raw", Claim: "raw", Block: true}}}),
	}
	var devs []string
	for _, p := range pods {
		vm.AddPod(p)
		if err := vm.WaitForAttachAndMount(ctx, p); err != nil {
			t.Fatal(err)
		}
		vols := vm.GetMountedVolumesForPod(p.UID)
		if len(vols) != 1 {
			t.Fatalf("pod %s: %+v", p.Name, vols)
		}
		fi, err := os.Stat(vols[0].Path)
		if err != nil || fi.Mode()&os.ModeDevice == 0 || fi.Mode()&os.ModeCharDevice != 0 {
			t.Fatalf("pod %s: %s is %v (%v), want a block device", p.Name, vols[0].Path, fi, err)
		}
		devs = append(devs, vols[0].Path)
	}
	if out, _ := exec.Command("losetup", "-a").CombinedOutput(); !strings.Contains(string(out), filepath.Join(root, "plugins/kubernetes.io/csi/volumeDevices", pv.Name, "dev")) {
		t.Errorf("no descriptor lock (loop device on the map file) in losetup -a:\n%s", out)
	}

	want := bytes.Repeat([]byte("nodevol block "), 300)
	writeAt(t, devs[0], want)
	if got := readAt(t, devs[1], len(want)); !bytes.Equal(got, want) {
		t.Fatalf("read through the second pod's device: %q..., want what the first wrote", got[:20])
	}

	deletePods(t, ctx, vm, pods)
	if err := waitUnstaged(ctx, vm); err != nil {
		t.Fatal(err)
	}
	assertClean(t, drv, root)
	for _, pattern := range []string{
		filepath.Join(root, "pods", "*", "volumeDevices", "kubernetes.io~csi", "*"),
		// The shared publish/ and staging/ parents stay, as with the kubelet.
		filepath.Join(root, "plugins", "kubernetes.io", "csi", "volumeDevices", pv.Name),
		filepath.Join(root, "plugins", "kubernetes.io", "csi", "volumeDevices", "*", pv.Name),
	} {
		if m, _ := filepath.Glob(pattern); len(m) > 0 {
			t.Errorf("left behind: %v", m)
		}
	}
}

func writeAt(t *testing.T, dev string, data []byte) {
	t.Helper()
	f, err := os.OpenFile(dev, os.O_WRONLY|os.O_SYNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, 4096); err != nil {
		t.Fatal(err)
	}
}

func readAt(t *testing.T, dev string, n int) []byte {
	t.Helper()
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, 4096); err != nil {
		t.Fatal(err)
	}
	return buf
}

// createBlockVolume creates a 16 MiB raw block volume named name on the loop
// driver's controller service (SINGLE_NODE_MULTI_WRITER, as the driver can
// share it on its node) and returns its handle.
func createBlockVolume(t *testing.T, ctx context.Context, drv *demoDriver, name string) string {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+drv.endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	vol, err := csi.NewControllerClient(conn).CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:          name,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 16 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return vol.GetVolume().GetVolumeId()
}
