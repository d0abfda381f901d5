package wrapped

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/internal/atomicwriter"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/internal/emptydir"
)

// TestVolumeStatsKeptUntilWritten: a volume's usage is measured once and
// answered until the volume is written again (each write, whether it
// changed anything or not, as the kubelet's new mounter at each set-up)
// or torn down, as the kubelet caches these kinds' du metrics.
func TestVolumeStatsKeptUntilWritten(t *testing.T) {
	ctx := context.Background()
	b, err := New("test", "example.com/test", emptydir.Config{RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	vol := podvol.PodVolume{Pod: podvol.PodRef{UID: "uid", Namespace: "ns", Name: "pod"}, SpecName: "v"}
	files := map[string]atomicwriter.File{"a": {Data: make([]byte, 10_000), Mode: 0o644}}
	setUp := func() string {
		t.Helper()
		dir, err := b.Wrapper.SetUp(ctx, vol, false, 0)
		if err != nil {
			t.Fatalf("SetUp: %v", err)
		}
		w, release, err := b.Writer(dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer release()
		if _, err := w.Write(ctx, files); err != nil {
			t.Fatalf("Write: %v", err)
		}
		return dir
	}
	used := func(dir string) int64 {
		t.Helper()
		s, ok, err := b.VolumeStats(ctx, nil, dir, "")
		if err != nil || !ok {
			t.Fatalf("VolumeStats: %v, %v", ok, err)
		}
		if s.CapacityBytes <= 0 || s.InodesUsed <= 0 {
			t.Errorf("VolumeStats: %+v, want the file system's capacity and the files' inodes", s)
		}
		return s.UsedBytes
	}
	grow := func(dir, name string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), make([]byte, 100_000), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	dir := setUp()
	first := used(dir)
	if first < 10_000 {
		t.Fatalf("UsedBytes %d, want at least the 10000 bytes written", first)
	}
	grow(dir, "behind")
	if got := used(dir); got != first {
		t.Errorf("UsedBytes %d after a change behind the writer's back, want the kept %d", got, first)
	}
	setUp() // the same files: nothing changed, and the volume set up again
	second := used(dir)
	if second < first+100_000 {
		t.Errorf("UsedBytes %d after the next write, want it measured again (at least %d)", second, first+100_000)
	}
	if err := b.TearDown(ctx, volume.MountRequest{Volume: vol}); err != nil {
		t.Fatalf("TearDown: %v", err)
	}
	if _, ok, err := b.VolumeStats(ctx, nil, dir, ""); err == nil || ok {
		t.Errorf("VolumeStats of a volume torn down: %v, %v; want an error", ok, err)
	}
	// Set up again without a write (a volume found at start): what was
	// kept before the tear-down is not answered.
	if _, err := b.Wrapper.SetUp(ctx, vol, false, 0); err != nil {
		t.Fatal(err)
	}
	if got := used(dir); got >= second {
		t.Errorf("UsedBytes %d of an empty volume after a tear-down, want less than the %d kept before", got, second)
	}
}
