package nfs

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// TestReconstruct: each pod directory of the plugin is found, Mounted
// when the mount table lists it, else Uncertain, named as the volume
// manager names the pod's volume; what is not a directory is unreadable,
// and nothing is removed.
func TestReconstruct(t *testing.T) {
	f, _ := newFixture(t, false)
	mounted := f.mkdir(t, "pods/u1/volumes/kubernetes.io~nfs/data")
	left := f.mkdir(t, "pods/u2/volumes/kubernetes.io~nfs/pv1")
	f.mkdir(t, "pods/u3/volumes/kubernetes.io~empty-dir/cache") // another plugin's
	file := filepath.Join(f.mkdir(t, "pods/u4/volumes/kubernetes.io~nfs"), "odd")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(t.TempDir(), filepath.Join(f.root, "pods/u5")); err != nil { // a pod directory that is a symlink
		t.Fatal(err)
	}
	got := f.p.Reconstruct(context.Background(), volume.Recovery{MountPoints: map[string]bool{mounted: true}})
	want := volume.Found{
		Mounts: []volume.FoundMount{
			{Spec: podvol.VolumeSpec{Name: "kubernetes.io/nfs/u1-data", Plugin: PluginName, Mode: podvol.Filesystem, Ephemeral: true},
				Volume: podvol.PodVolume{Pod: podvol.PodRef{UID: "u1"}, SpecName: "data"}, Path: mounted, State: podvol.Mounted},
			{Spec: podvol.VolumeSpec{Name: "kubernetes.io/nfs/u2-pv1", Plugin: PluginName, Mode: podvol.Filesystem, Ephemeral: true},
				Volume: podvol.PodVolume{Pod: podvol.PodRef{UID: "u2"}, SpecName: "pv1"}, Path: left, State: podvol.Uncertain},
		},
		Unreadable: []string{file},
		Attempted:  3,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("Reconstruct (-want +got):\n%s", diff)
	}
	// Without a mount table nothing is trusted as Mounted.
	for _, m := range f.p.Reconstruct(context.Background(), volume.Recovery{}).Mounts {
		if m.State != podvol.Uncertain {
			t.Errorf("without a mount table, %s is %v", m.Path, m.State)
		}
	}
	for _, p := range []string{mounted, left, file} {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("Reconstruct removed %s: %v", p, err)
		}
	}
	// The found volume tears down from what was found.
	if err := f.p.TearDown(context.Background(), volume.MountRequest{Spec: &got.Mounts[1].Spec, Volume: got.Mounts[1].Volume}); err != nil || f.exists("pods/u2/volumes/kubernetes.io~nfs/pv1") {
		t.Errorf("TearDown of a found volume: %v, directory left %v", err, f.exists("pods/u2/volumes/kubernetes.io~nfs/pv1"))
	}
}

// TestRetake: only an empty directory that is no mount point goes; a
// file, a mount point, a directory with data, and anything when the mount
// table is unknown stay.
func TestRetake(t *testing.T) {
	f, _ := newFixture(t, false)
	empty := f.mkdir(t, "pods/u1/volumes/kubernetes.io~nfs/a")
	full := f.mkdir(t, "pods/u1/volumes/kubernetes.io~nfs/b")
	if err := os.WriteFile(filepath.Join(full, "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(f.root, "pods/u1/volumes/kubernetes.io~nfs/c")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	mountPoint := f.mkdir(t, "pods/u1/volumes/kubernetes.io~nfs/d")
	table := map[string]bool{mountPoint: true}
	ctx := context.Background()
	if f.p.Retake(ctx, empty, nil) {
		t.Error("Retake without a mount table removed a directory")
	}
	for _, p := range []string{full, file, mountPoint, "/etc"} {
		if f.p.Retake(ctx, p, table) {
			t.Errorf("Retake(%s) = true", p)
		}
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("Retake removed %s", p)
		}
	}
	if !f.p.Retake(ctx, empty, table) || f.exists("pods/u1/volumes/kubernetes.io~nfs/a") {
		t.Error("Retake kept an empty directory")
	}
}

// TestVolumeStats: statfs of the pod's mount, as the kubelet's
// MetricsStatFS; a symlink as the volume path is refused.
func TestVolumeStats(t *testing.T) {
	f, _ := newFixture(t, false)
	dir := f.mkdir(t, "pods/u1/volumes/kubernetes.io~nfs/data")
	spec := inline("u1", "s", "/e", false)
	got, ok, err := f.p.VolumeStats(context.Background(), spec, dir, "")
	if err != nil || !ok {
		t.Fatalf("VolumeStats = %v, %v", ok, err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if got.CapacityBytes != int64(st.Blocks)*st.Bsize || got.Inodes != int64(st.Files) || got.UsedBytes < 0 || got.AvailableBytes < 0 || got.InodesUsed < 0 {
		t.Errorf("VolumeStats = %+v, want statfs of %s (%d blocks of %d, %d inodes)", got, dir, st.Blocks, st.Bsize, st.Files)
	}
	link := filepath.Join(f.root, "pods/u1/volumes/kubernetes.io~nfs/link")
	if err := os.Symlink(t.TempDir(), link); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := f.p.VolumeStats(context.Background(), spec, link, ""); err == nil || ok {
		t.Errorf("VolumeStats through a symlink = %v, %v; want an error", ok, err)
	}
}
