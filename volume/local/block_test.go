package local

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// TestBlock: a Block PV's device is mapped into the pod in the kubelet's
// layout, through the mapper; the map files keep UnmountDevice off until
// each pod's is unmapped; unmapping works from the symlink alone.
func TestBlock(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s := spec("pv1", f.dev, podvol.Block)
	vol := podVol("u1")
	if dmp, err := f.p.MountDevice(ctx, volume.DeviceRequest{Spec: s, Pod: vol}); err != nil || dmp != "" {
		t.Fatalf("MountDevice = %q, %v; want nothing staged", dmp, err)
	}
	link, err := f.p.SetUp(ctx, volume.MountRequest{Spec: s, Volume: vol})
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(f.root, "pods/u1/volumeDevices/kubernetes.io~local-volume/pv1"); link != want {
		t.Errorf("SetUp = %q, want %q", link, want)
	}
	if target, err := os.Readlink(link); err != nil || target != f.dev {
		t.Errorf("symlink -> %q, %v; want %q", target, err, f.dev)
	}
	mapFile := "plugins/kubernetes.io~local-volume/volumeDevices/pv1/u1"
	if diff := cmp.Diff([]string{f.dev + " -> " + mapFile + " [bind]"}, f.mounts()); diff != "" {
		t.Errorf("mounts (-want +got):\n%s", diff)
	}
	if dev, _ := f.loop.Find(ctx, filepath.Join(f.root, mapFile)); dev == "" {
		t.Error("no loop device holds the map file")
	}
	wantSteps := []string{
		"mkdir plugins", "mkdir plugins/kubernetes.io~local-volume", "mkdir plugins/kubernetes.io~local-volume/volumeDevices",
		"mkdir plugins/kubernetes.io~local-volume/volumeDevices/pv1",
		"mkdir pods", "mkdir pods/u1", "mkdir pods/u1/volumeDevices", "mkdir pods/u1/volumeDevices/kubernetes.io~local-volume",
		"create " + mapFile, "mount " + mapFile, "loop-attach " + mapFile,
	}
	if diff := cmp.Diff(wantSteps, f.steps); diff != "" {
		t.Errorf("steps (-want +got):\n%s", diff)
	}
	found := foundSpec("pv1", podvol.Block)
	var inUse *volume.InUseError
	if err := f.p.UnmountDevice(ctx, volume.DeviceRequest{Spec: &found}); !errors.As(err, &inUse) || len(inUse.Refs) != 1 {
		t.Fatalf("UnmountDevice while mapped = %v, want an InUseError naming the map file", err)
	}
	for i := range 2 {
		if err := f.p.TearDown(ctx, volume.MountRequest{Spec: &found, Volume: vol}); err != nil {
			t.Fatalf("TearDown %d: %v", i, err)
		}
	}
	for i := range 2 {
		if err := f.p.UnmountDevice(ctx, volume.DeviceRequest{Spec: &found}); err != nil {
			t.Fatalf("UnmountDevice %d: %v", i, err)
		}
	}
	if len(f.mounter.MountPoints) != 0 || len(f.loop.devices) != 0 {
		t.Errorf("left: mounts %v, loop devices %v", f.mounts(), f.loop.devices)
	}
	for _, rel := range []string{"pods/u1/volumeDevices/kubernetes.io~local-volume/pv1", mapFile, "plugins/kubernetes.io~local-volume/volumeDevices/pv1"} {
		if f.exists(rel) {
			t.Errorf("%s left", rel)
		}
	}
}

// TestBlockBadInput: a directory as a Block PV, and a pod symlink that
// is not the plugin's, are refused.
func TestBlockBadInput(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if _, err := f.p.SetUp(ctx, volume.MountRequest{Spec: spec("pv1", f.dir, podvol.Block), Volume: podVol("u1")}); err == nil ||
		!strings.Contains(err.Error(), "needs a block device") || f.exists("pods") {
		t.Errorf("Block PV on a directory: %v (pods/ made: %v)", err, f.exists("pods"))
	}
	dir := filepath.Join(f.root, "pods/u1/volumeDevices/kubernetes.io~local-volume")
	if err := os.MkdirAll(filepath.Join(dir, "pv1"), 0o750); err != nil {
		t.Fatal(err)
	}
	found := foundSpec("pv1", podvol.Block)
	if err := f.p.TearDown(ctx, volume.MountRequest{Spec: &found, Volume: podVol("u1")}); err == nil || !f.exists("pods/u1/volumeDevices/kubernetes.io~local-volume/pv1") {
		t.Errorf("TearDown of a directory where the symlink should be: %v; want an error and the directory kept", err)
	}
}
