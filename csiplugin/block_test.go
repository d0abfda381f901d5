package csiplugin

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/nodevol/nodevol/cache"
	"github.com/nodevol/nodevol/csiplugin/csitest"
	oe "github.com/nodevol/nodevol/operationexecutor"
	"github.com/nodevol/nodevol/util/blockdev"
)

// fakeBlockMapper records Map and Unmap.
type fakeBlockMapper struct {
	calls  []string
	maps   []blockdev.Map
	mapErr error
}

func (f *fakeBlockMapper) Map(_ context.Context, m blockdev.Map) error {
	f.calls = append(f.calls, "map "+m.PodUID)
	f.maps = append(f.maps, m)
	return f.mapErr
}

func (f *fakeBlockMapper) Unmap(_ context.Context, m blockdev.Map) error {
	f.calls = append(f.calls, "unmap "+m.PodUID)
	return nil
}

func blockSpec() *cache.VolumeSpec {
	s := testSpec(drv)
	s.Mode = cache.Block
	s.FSType = ""
	return s
}

// TestBlockVolume: stage, publish and map, unmap and unpublish, unstage,
// with the kubelet's paths, block capabilities and vol_data.json; nothing
// is left but the pod's device directory's parent.
func TestBlockVolume(t *testing.T) {
	e := newEnv(t, envOptions{driver: csitest.Options{CreateTargetDirs: true}})
	bm := &fakeBlockMapper{}
	e.p.blockMapper = bm
	ctx := context.Background()
	spec := blockSpec()
	vol := podVolume("a", "data")
	paths, err := BlockVolumePaths(e.root, "pv-1", vol.Pod.UID)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(e.root, "plugins/kubernetes.io/csi/volumeDevices/staging/pv-1"); paths.StagingPath != want {
		t.Errorf("staging path %s, want %s", paths.StagingPath, want)
	}

	staging, err := e.p.MountDevice(ctx, oe.DeviceRequest{Spec: spec})
	if err != nil || staging != paths.StagingPath {
		t.Fatalf("MountDevice = %q, %v; want %s", staging, err, paths.StagingPath)
	}
	stage := e.request(t, "NodeStageVolume").(*csi.NodeStageVolumeRequest)
	if stage.GetStagingTargetPath() != paths.StagingPath || stage.GetVolumeCapability().GetBlock() == nil {
		t.Errorf("NodeStageVolume %v: want block access at %s", stage, paths.StagingPath)
	}
	data, err := LoadVolumeData(paths.DataDir)
	if err != nil || data.SpecVolID != "pv-1" || data.VolumeHandle != "vol-1" || data.DriverName != drv {
		t.Errorf("vol_data.json %+v, %v", data, err)
	}

	dev, err := e.p.SetUp(ctx, oe.MountRequest{Spec: spec, Volume: vol, DeviceMountPath: staging})
	if err != nil || dev != filepath.Join(e.root, "pods", "uid-a", "volumeDevices/kubernetes.io~csi/pv-1") {
		t.Fatalf("SetUp = %q, %v", dev, err)
	}
	pub := e.request(t, "NodePublishVolume").(*csi.NodePublishVolumeRequest)
	if pub.GetTargetPath() != paths.PublishPath || pub.GetStagingTargetPath() != paths.StagingPath || pub.GetVolumeCapability().GetBlock() == nil {
		t.Errorf("NodePublishVolume %v: want block access at %s staged at %s", pub, paths.PublishPath, paths.StagingPath)
	}
	if len(bm.maps) != 1 || bm.maps[0] != (blockdev.Map{DevicePath: paths.PublishPath, GlobalMapPath: paths.GlobalMapPath, PodUID: "uid-a", PodDeviceDir: paths.PodDeviceDir, Name: "pv-1"}) {
		t.Errorf("maps %+v", bm.maps)
	}

	if err := e.p.TearDown(ctx, oe.MountRequest{Spec: spec, Volume: vol}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"map uid-a", "unmap uid-a"}; len(bm.calls) != 2 || bm.calls[1] != want[1] {
		t.Errorf("mapper calls %v, want %v", bm.calls, want)
	}
	if n := e.srv.Calls("NodeUnpublishVolume"); n != 1 {
		t.Errorf("NodeUnpublishVolume calls %d, want 1", n)
	}
	if err := e.p.UnmountDevice(ctx, oe.DeviceRequest{Spec: spec}); err != nil {
		t.Fatal(err)
	}
	if n := e.srv.Calls("NodeUnstageVolume"); n != 1 {
		t.Errorf("NodeUnstageVolume calls %d, want 1", n)
	}
	for _, p := range []string{paths.StagingPath, paths.PublishDir, paths.Dir} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s left after unstaging: %v", p, err)
		}
	}
	// Idempotent: again, nothing to do and no calls.
	if err := e.p.TearDown(ctx, oe.MountRequest{Spec: spec, Volume: vol}); err != nil {
		t.Error(err)
	}
	if err := e.p.UnmountDevice(ctx, oe.DeviceRequest{Spec: spec}); err != nil {
		t.Error(err)
	}
	if e.srv.Calls("NodeUnpublishVolume") != 1 || e.srv.Calls("NodeUnstageVolume") != 1 {
		t.Error("repeated teardown called the driver again")
	}
}

func TestBlockVolumeWithoutStaging(t *testing.T) {
	e := newEnv(t, envOptions{driver: csitest.Options{CreateTargetDirs: true, NoStageUnstage: true}})
	e.p.blockMapper = &fakeBlockMapper{}
	spec := blockSpec()
	staging, err := e.p.MountDevice(context.Background(), oe.DeviceRequest{Spec: spec})
	if err != nil || staging != "" {
		t.Fatalf("MountDevice = %q, %v; want nothing staged", staging, err)
	}
	if _, err := e.p.SetUp(context.Background(), oe.MountRequest{Spec: spec, Volume: podVolume("a", "data")}); err != nil {
		t.Fatal(err)
	}
	if pub := e.request(t, "NodePublishVolume").(*csi.NodePublishVolumeRequest); pub.GetStagingTargetPath() != "" {
		t.Errorf("NodePublishVolume staging path %q, want none", pub.GetStagingTargetPath())
	}
}

func TestBlockVolumeBadInput(t *testing.T) {
	e := newEnv(t, envOptions{driver: csitest.Options{CreateTargetDirs: true, NoStageUnstage: true}})
	bm := &fakeBlockMapper{mapErr: errors.New("not a block device")}
	e.p.blockMapper = bm
	ctx := context.Background()

	// Published, then not mappable: Uncertain, to be torn down.
	_, err := e.p.SetUp(ctx, oe.MountRequest{Spec: blockSpec(), Volume: podVolume("a", "data")})
	if !oe.IsUncertain(err) {
		t.Errorf("SetUp with a failing map = %v, want Uncertain", err)
	}
	noPV := blockSpec()
	noPV.PVName = ""
	if _, err := e.p.MountDevice(ctx, oe.DeviceRequest{Spec: noPV}); err == nil {
		t.Error("MountDevice of a block volume without a PV succeeded")
	}
	escaping := blockSpec()
	escaping.PVName = "../../etc"
	if _, err := e.p.SetUp(ctx, oe.MountRequest{Spec: escaping, Volume: podVolume("b", "data")}); err == nil || oe.IsUncertain(err) {
		t.Errorf("SetUp with PV name ../../etc = %v, want a final error", err)
	}
	if _, err := BlockVolumePaths(e.root, "pv-1", "a/b"); err == nil {
		t.Error("BlockVolumePaths accepted pod UID a/b")
	}
}
