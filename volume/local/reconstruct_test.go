package local

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// mountPoints is the fake mount table as a Recovery's MountPoints.
func (f *fixture) mountPoints() map[string]bool {
	m := map[string]bool{}
	for _, mp := range f.mounter.MountPoints {
		m[mp.Path] = true
	}
	return m
}

// TestReconstruct: what SetUp, MountDevice and a cut-short unmap leave is
// found as the volume manager names it, Mounted only where the mount
// table shows a mount; a restarted plugin tears it all down from that.
func TestReconstruct(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	var cmds []string
	f.script(&cmds, "TYPE=ext4\n", nil) // blkid, fsck
	must := func(_ string, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(f.p.SetUp(ctx, volume.MountRequest{Spec: spec("pv1", f.dir, podvol.Filesystem), Volume: podVol("u1")}))
	must(f.p.MountDevice(ctx, volume.DeviceRequest{Spec: spec("pv3", f.dev, podvol.Filesystem)}))
	must(f.p.SetUp(ctx, volume.MountRequest{Spec: spec("pv3", f.dev, podvol.Filesystem), Volume: podVol("u2")}))
	must(f.p.SetUp(ctx, volume.MountRequest{Spec: spec("pv4", f.dev, podvol.Block), Volume: podVol("u1")}))
	must(f.p.SetUp(ctx, volume.MountRequest{Spec: spec("pv4", f.dev, podvol.Block), Volume: podVol("u3")}))
	// A TearDown cut short: the directory left, not mounted.
	mkdir(t, filepath.Join(f.root, "pods/u2/volumes/kubernetes.io~local-volume/pv2"))
	// An unmap cut short after the symlink went.
	if err := os.Remove(filepath.Join(f.root, "pods/u3/volumeDevices/kubernetes.io~local-volume/pv4")); err != nil {
		t.Fatal(err)
	}
	// Not the plugin's: skipped.
	if err := os.Symlink(f.dir, filepath.Join(f.root, "pods/u2/volumes/kubernetes.io~local-volume/evil")); err != nil {
		t.Fatal(err)
	}
	mount := func(uid, pv string, mode podvol.VolumeMode, path string, state podvol.MountState) volume.FoundMount {
		return volume.FoundMount{Spec: foundSpec(pv, mode), Volume: podvol.PodVolume{Pod: podvol.PodRef{UID: types.UID(uid)}, SpecName: pv},
			Path: filepath.Join(f.root, path), State: state}
	}
	device := func(pv string, mode podvol.VolumeMode, path string, state podvol.MountState) volume.FoundDevice {
		return volume.FoundDevice{Spec: foundSpec(pv, mode), Path: filepath.Join(f.root, path), State: state}
	}
	tests := []struct {
		name   string
		mounts map[string]bool
		want   volume.Found
	}{
		{name: "mount table known", mounts: f.mountPoints(), want: volume.Found{
			Mounts: []volume.FoundMount{
				mount("u1", "pv1", podvol.Filesystem, "pods/u1/volumes/kubernetes.io~local-volume/pv1", podvol.Mounted),
				mount("u1", "pv4", podvol.Block, "pods/u1/volumeDevices/kubernetes.io~local-volume/pv4", podvol.Uncertain),
				mount("u2", "pv2", podvol.Filesystem, "pods/u2/volumes/kubernetes.io~local-volume/pv2", podvol.Uncertain),
				mount("u2", "pv3", podvol.Filesystem, "pods/u2/volumes/kubernetes.io~local-volume/pv3", podvol.Mounted),
				mount("u3", "pv4", podvol.Block, "pods/u3/volumeDevices/kubernetes.io~local-volume/pv4", podvol.Uncertain),
			},
			Devices: []volume.FoundDevice{
				device("pv3", podvol.Filesystem, "plugins/kubernetes.io/local-volume/mounts/pv3", podvol.Mounted),
				device("pv4", podvol.Block, "plugins/kubernetes.io~local-volume/volumeDevices/pv4", podvol.Uncertain),
			},
			Attempted: 5,
		}},
		{name: "mount table unknown", want: volume.Found{
			Mounts: []volume.FoundMount{
				mount("u1", "pv1", podvol.Filesystem, "pods/u1/volumes/kubernetes.io~local-volume/pv1", podvol.Uncertain),
				mount("u1", "pv4", podvol.Block, "pods/u1/volumeDevices/kubernetes.io~local-volume/pv4", podvol.Uncertain),
				mount("u2", "pv2", podvol.Filesystem, "pods/u2/volumes/kubernetes.io~local-volume/pv2", podvol.Uncertain),
				mount("u2", "pv3", podvol.Filesystem, "pods/u2/volumes/kubernetes.io~local-volume/pv3", podvol.Uncertain),
				mount("u3", "pv4", podvol.Block, "pods/u3/volumeDevices/kubernetes.io~local-volume/pv4", podvol.Uncertain),
			},
			Devices: []volume.FoundDevice{
				device("pv3", podvol.Filesystem, "plugins/kubernetes.io/local-volume/mounts/pv3", podvol.Uncertain),
				device("pv4", podvol.Block, "plugins/kubernetes.io~local-volume/volumeDevices/pv4", podvol.Uncertain),
			},
			Attempted: 5,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := f.p.Reconstruct(ctx, volume.Recovery{MountPoints: tt.mounts})
			for _, ms := range [][]volume.FoundMount{got.Mounts, tt.want.Mounts} {
				sort.Slice(ms, func(i, j int) bool { return ms[i].Path < ms[j].Path })
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Reconstruct (-want +got):\n%s", diff)
			}
		})
	}
	checkRestartTearsDown(t, f)
}

// checkRestartTearsDown: a restarted plugin tears down what it finds on
// f's root and mount table, the pods first, then the devices, and leaves
// nothing of the plugin's; a symlink that is not its own stays.
func checkRestartTearsDown(t *testing.T, f *fixture) {
	t.Helper()
	ctx := context.Background()
	restarted := newFixtureOn(t, f)
	found := restarted.p.Reconstruct(ctx, volume.Recovery{MountPoints: f.mountPoints()})
	for _, m := range found.Mounts {
		if err := restarted.p.TearDown(ctx, volume.MountRequest{Spec: &m.Spec, Volume: m.Volume}); err != nil {
			t.Errorf("TearDown of %s: %v", m.Path, err)
		}
	}
	for _, d := range found.Devices {
		if err := restarted.p.UnmountDevice(ctx, volume.DeviceRequest{Spec: &d.Spec, DeviceMountPath: d.Path}); err != nil {
			t.Errorf("UnmountDevice of %s: %v", d.Path, err)
		}
	}
	if len(f.mounter.MountPoints) != 0 || len(f.loop.devices) != 0 {
		t.Errorf("left: mounts %v, loop devices %v", f.mounts(), f.loop.devices)
	}
	if left := restarted.p.Reconstruct(ctx, volume.Recovery{MountPoints: f.mountPoints()}); len(left.Mounts)+len(left.Devices) != 0 {
		t.Errorf("found after the teardown: %+v", left)
	}
	if _, err := os.Lstat(filepath.Join(f.root, "pods/u2/volumes/kubernetes.io~local-volume/evil")); err != nil {
		t.Errorf("the symlink that is not the plugin's: %v", err)
	}
}

// newFixtureOn is a new plugin (a restart) on f's root, mounter and loop
// devices.
func newFixtureOn(t *testing.T, f *fixture) *fixture {
	t.Helper()
	g := *f
	p, err := newPlugin(Config{RootDir: f.root, Mounter: f.flaky, BlockMapper: f.p.blockMapper, Exec: f.exec})
	if err != nil {
		t.Fatal(err)
	}
	p.fileType = f.p.fileType
	g.p = p
	return &g
}

func mkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
}

// TestRetake: a directory is removed only when it is empty and the mount
// table is known and does not show it.
func TestRetake(t *testing.T) {
	f := newFixture(t)
	dir := filepath.Join(f.root, "pods/u1/volumes/kubernetes.io~local-volume/pv1")
	mkdir(t, dir)
	if f.p.Retake(context.Background(), dir, nil) || f.p.Retake(context.Background(), dir, map[string]bool{dir: true}) {
		t.Error("Retake with the mount table unknown, or showing the directory mounted")
	}
	if err := os.WriteFile(filepath.Join(dir, "data"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if f.p.Retake(context.Background(), dir, map[string]bool{}) {
		t.Error("Retake removed a directory with data")
	}
	if err := os.Remove(filepath.Join(dir, "data")); err != nil {
		t.Fatal(err)
	}
	if !f.p.Retake(context.Background(), dir, map[string]bool{}) || f.exists("pods/u1/volumes/kubernetes.io~local-volume/pv1") {
		t.Error("Retake kept an empty directory")
	}
}
