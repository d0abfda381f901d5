package csiplugin

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// fakeBlockMapper records Map and Unmap.
type fakeBlockMapper struct {
	calls  []string
	maps   []volume.BlockMap
	mapErr error
}

func (f *fakeBlockMapper) Map(_ context.Context, m volume.BlockMap) error {
	f.calls = append(f.calls, "map "+m.PodUID)
	f.maps = append(f.maps, m)
	return f.mapErr
}

func (f *fakeBlockMapper) Unmap(_ context.Context, m volume.BlockMap) error {
	f.calls = append(f.calls, "unmap "+m.PodUID)
	return nil
}

func blockSpec() *podvol.VolumeSpec {
	s := testSpec(drv)
	s.Mode = podvol.Block
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
	paths, err := ondisk.BlockVolumePaths(e.root, "pv-1", vol.Pod.UID)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(e.root, "plugins/kubernetes.io/csi/volumeDevices/staging/pv-1"); paths.StagingPath != want {
		t.Errorf("staging path %s, want %s", paths.StagingPath, want)
	}

	staging, err := e.p.MountDevice(ctx, volume.DeviceRequest{Spec: spec})
	if err != nil || staging != paths.StagingPath {
		t.Fatalf("MountDevice = %q, %v; want %s", staging, err, paths.StagingPath)
	}
	stage := e.request(t, "NodeStageVolume").(*csipb.NodeStageVolumeRequest)
	if stage.GetStagingTargetPath() != paths.StagingPath || stage.GetVolumeCapability().GetBlock() == nil {
		t.Errorf("NodeStageVolume %v: want block access at %s", stage, paths.StagingPath)
	}
	data, err := ondisk.LoadVolumeData(paths.DataDir)
	if err != nil || data.SpecVolID != "pv-1" || data.VolumeHandle != "vol-1" || data.DriverName != drv {
		t.Errorf("vol_data.json %+v, %v", data, err)
	}

	dev, err := e.p.SetUp(ctx, volume.MountRequest{Spec: spec, Volume: vol, DeviceMountPath: staging})
	if err != nil || dev != filepath.Join(e.root, "pods", "uid-a", "volumeDevices/kubernetes.io~csi/pv-1") {
		t.Fatalf("SetUp = %q, %v", dev, err)
	}
	pub := e.request(t, "NodePublishVolume").(*csipb.NodePublishVolumeRequest)
	if pub.GetTargetPath() != paths.PublishPath || pub.GetStagingTargetPath() != paths.StagingPath || pub.GetVolumeCapability().GetBlock() == nil {
		t.Errorf("NodePublishVolume %v: want block access at %s staged at %s", pub, paths.PublishPath, paths.StagingPath)
	}
	if len(bm.maps) != 1 || bm.maps[0] != (volume.BlockMap{DevicePath: paths.PublishPath, GlobalMapPath: paths.GlobalMapPath, PodUID: "uid-a", PodDeviceDir: paths.PodDeviceDir, Name: "pv-1"}) {
		t.Errorf("maps %+v", bm.maps)
	}

	if err := e.p.TearDown(ctx, volume.MountRequest{Spec: spec, Volume: vol}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"map uid-a", "unmap uid-a"}; len(bm.calls) != 2 || bm.calls[1] != want[1] {
		t.Errorf("mapper calls %v, want %v", bm.calls, want)
	}
	if n := e.srv.Calls("NodeUnpublishVolume"); n != 1 {
		t.Errorf("NodeUnpublishVolume calls %d, want 1", n)
	}
	if err := e.p.UnmountDevice(ctx, volume.DeviceRequest{Spec: spec}); err != nil {
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
	if err := e.p.TearDown(ctx, volume.MountRequest{Spec: spec, Volume: vol}); err != nil {
		t.Error(err)
	}
	if err := e.p.UnmountDevice(ctx, volume.DeviceRequest{Spec: spec}); err != nil {
		t.Error(err)
	}
	if e.srv.Calls("NodeUnpublishVolume") != 1 || e.srv.Calls("NodeUnstageVolume") != 1 {
		t.Error("repeated teardown called the driver again")
	}
}

// TestBlockPublishFindsStaging: a block publish not told where the volume
// was staged (after a restart) sends the block staging path, as a
// file-system publish sends its own (TestLegacyStagingPath).
func TestBlockPublishFindsStaging(t *testing.T) {
	e := newEnv(t, envOptions{driver: csitest.Options{CreateTargetDirs: true}})
	e.p.blockMapper = &fakeBlockMapper{}
	ctx := context.Background()
	spec, vol := blockSpec(), podVolume("a", "data")
	staging, err := e.p.MountDevice(ctx, volume.DeviceRequest{Spec: spec})
	if err != nil || staging == "" {
		t.Fatalf("MountDevice = %q, %v", staging, err)
	}
	if _, err := e.p.SetUp(ctx, volume.MountRequest{Spec: spec, Volume: vol}); err != nil {
		t.Fatal(err)
	}
	if got := e.request(t, "NodePublishVolume").(*csipb.NodePublishVolumeRequest).GetStagingTargetPath(); got != staging {
		t.Errorf("NodePublishVolume staging path %q, want %s", got, staging)
	}
}

func TestBlockVolumeWithoutStaging(t *testing.T) {
	e := newEnv(t, envOptions{driver: csitest.Options{CreateTargetDirs: true, NoStageUnstage: true}})
	e.p.blockMapper = &fakeBlockMapper{}
	spec := blockSpec()
	staging, err := e.p.MountDevice(context.Background(), volume.DeviceRequest{Spec: spec})
	if err != nil || staging != "" {
		t.Fatalf("MountDevice = %q, %v; want nothing staged", staging, err)
	}
	if _, err := e.p.SetUp(context.Background(), volume.MountRequest{Spec: spec, Volume: podVolume("a", "data")}); err != nil {
		t.Fatal(err)
	}
	if pub := e.request(t, "NodePublishVolume").(*csipb.NodePublishVolumeRequest); pub.GetStagingTargetPath() != "" {
		t.Errorf("NodePublishVolume staging path %q, want none", pub.GetStagingTargetPath())
	}
}

func TestBlockVolumeBadInput(t *testing.T) {
	e := newEnv(t, envOptions{driver: csitest.Options{CreateTargetDirs: true, NoStageUnstage: true}})
	bm := &fakeBlockMapper{mapErr: errors.New("not a block device")}
	e.p.blockMapper = bm
	ctx := context.Background()

	// Published, then not mappable: Uncertain, to be torn down.
	_, err := e.p.SetUp(ctx, volume.MountRequest{Spec: blockSpec(), Volume: podVolume("a", "data")})
	if !volume.IsUncertain(err) {
		t.Errorf("SetUp with a failing map = %v, want Uncertain", err)
	}
	noPV := blockSpec()
	noPV.PVName = ""
	if _, err := e.p.MountDevice(ctx, volume.DeviceRequest{Spec: noPV}); err == nil {
		t.Error("MountDevice of a block volume without a PV succeeded")
	}
	escaping := blockSpec()
	escaping.PVName = "../../etc"
	if _, err := e.p.SetUp(ctx, volume.MountRequest{Spec: escaping, Volume: podVolume("b", "data")}); err == nil || volume.IsUncertain(err) {
		t.Errorf("SetUp with PV name ../../etc = %v, want a final error", err)
	}
	if _, err := ondisk.BlockVolumePaths(e.root, "pv-1", "a/b"); err == nil {
		t.Error("BlockVolumePaths accepted pod UID a/b")
	}
}

// publishBlock stages block volume pv-1 and publishes it for pod a.
func publishBlock(t *testing.T, e *env) (*podvol.VolumeSpec, podvol.PodVolume, ondisk.BlockPaths) {
	t.Helper()
	e.p.blockMapper = &fakeBlockMapper{}
	ctx := context.Background()
	spec, vol := blockSpec(), podVolume("a", "data")
	paths, err := ondisk.BlockVolumePaths(e.root, "pv-1", vol.Pod.UID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.MountDevice(ctx, volume.DeviceRequest{Spec: spec}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.SetUp(ctx, volume.MountRequest{Spec: spec, Volume: vol, DeviceMountPath: paths.StagingPath}); err != nil {
		t.Fatal(err)
	}
	return spec, vol, paths
}

// setRecordPhase rewrites the record of path (absolute) in phase ph, as a
// process stopped at that phase leaves it.
func setRecordPhase(t *testing.T, e *env, path string, ph ondisk.Phase) {
	t.Helper()
	rel, err := e.p.rfs.Rel(path)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := ondisk.ReadRecord(e.p.rfs, rel)
	if err != nil {
		t.Fatal(err)
	}
	rec.Phase = ph
	if err := e.p.records.Write(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
}

// TestBlockUnstageRefusedWhilePublished: a block volume is not unstaged
// while a publish of it may remain, whether its publish path is there or
// only its record (read again from disk, as after a restart): the refusal
// is an *volume.InUseError naming the volume and the publish path, and the
// driver is not asked. Once the pod's volume is unpublished, it unstages.
func TestBlockUnstageRefusedWhilePublished(t *testing.T) {
	e := newEnv(t, envOptions{driver: csitest.Options{CreateTargetDirs: true}})
	ctx := context.Background()
	spec, vol, paths := publishBlock(t, e)
	refused := func(when string) {
		t.Helper()
		err := e.p.UnmountDevice(ctx, volume.DeviceRequest{Spec: spec})
		var inUse *volume.InUseError
		if !errors.As(err, &inUse) || len(inUse.Refs) != 1 || inUse.Refs[0] != paths.PublishPath ||
			!strings.Contains(err.Error(), "pv-1") || !strings.Contains(err.Error(), paths.PublishPath) {
			t.Fatalf("%s: UnmountDevice = %v; want an InUseError naming pv-1 and %s", when, err, paths.PublishPath)
		}
		if n := e.srv.Calls("NodeUnstageVolume"); n != 0 {
			t.Fatalf("%s: NodeUnstageVolume called %d times under a publish", when, n)
		}
		if _, err := os.Stat(filepath.Join(paths.DataDir, ondisk.VolumeDataFile)); err != nil {
			t.Fatalf("%s: vol_data.json: %v, want it kept", when, err)
		}
	}
	refused("publish path there")

	// The driver holds the publish but its target is gone: the record is
	// what is left of it, for this plugin and for one that reads the
	// records again.
	if err := os.Remove(paths.PublishPath); err != nil {
		t.Fatal(err)
	}
	refused("record only")
	e.p.records = ondisk.NewRecords(e.p.rfs, e.p.records.BootID())
	refused("record only, read from disk")

	if err := e.p.TearDown(ctx, volume.MountRequest{Spec: spec, Volume: vol}); err != nil {
		t.Fatal(err)
	}
	if err := e.p.UnmountDevice(ctx, volume.DeviceRequest{Spec: spec}); err != nil {
		t.Fatalf("UnmountDevice after the unpublish: %v", err)
	}
	if _, staged := e.srv.StagedVolumes()["vol-1"]; staged || len(e.srv.PublishedVolumes()["vol-1"]) != 0 {
		t.Errorf("driver: staged %v, published %v; want neither", staged, e.srv.PublishedVolumes()["vol-1"])
	}
	if _, err := os.Lstat(paths.Dir); !os.IsNotExist(err) {
		t.Errorf("%s after unstaging: %v, want removed", paths.Dir, err)
	}
}

// TestBlockUnmapResumes: an unmap cut short at any step is finished by the
// next one: NodeUnpublishVolume is sent while the publish path is there
// (the pod's symlink and map file already gone, the record Unpublishing)
// or while the record says a publish was sent, and not for a publish the
// record says is being undone and whose path the driver removed.
func TestBlockUnmapResumes(t *testing.T) {
	for _, tc := range []struct {
		name          string
		phase         ondisk.Phase
		removePath    bool
		wantUnpublish int
	}{
		{"stopped before NodeUnpublishVolume", ondisk.PhaseUnpublishing, false, 1},
		{"target not created by the driver", ondisk.PhasePublished, true, 1},
		{"publish in flight, no target yet", ondisk.PhasePublishing, true, 1},
		{"stopped after NodeUnpublishVolume", ondisk.PhaseUnpublishing, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{driver: csitest.Options{CreateTargetDirs: true}})
			ctx := context.Background()
			spec, vol, paths := publishBlock(t, e)
			setRecordPhase(t, e, paths.PublishPath, tc.phase)
			if tc.removePath {
				if err := os.Remove(paths.PublishPath); err != nil {
					t.Fatal(err)
				}
			}
			if err := e.p.TearDown(ctx, volume.MountRequest{Spec: spec, Volume: vol}); err != nil {
				t.Fatal(err)
			}
			if n := e.srv.Calls("NodeUnpublishVolume"); n != tc.wantUnpublish {
				t.Errorf("NodeUnpublishVolume calls %d, want %d", n, tc.wantUnpublish)
			}
			rel, _ := e.p.rfs.Rel(paths.PublishPath)
			if _, err := ondisk.ReadRecord(e.p.rfs, rel); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("record after the unmap: %v, want removed", err)
			}
			if _, err := os.Lstat(paths.PublishPath); !os.IsNotExist(err) {
				t.Errorf("publish path after the unmap: %v, want removed", err)
			}
		})
	}
}
