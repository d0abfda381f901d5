package emptydir

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

func TestReconstruct(t *testing.T) {
	tests := []struct {
		name     string
		ready    bool
		mounted  bool
		nilTable bool
		want     podvol.MountState
	}{
		{name: "ready and a mount point", ready: true, mounted: true, want: podvol.Mounted},
		{name: "ready, a plain directory", ready: true, want: podvol.Uncertain},
		{name: "not ready, a mount point", mounted: true, want: podvol.Uncertain},
		{name: "not ready", want: podvol.Uncertain},
		{name: "ready, mount table unknown", ready: true, mounted: true, nilTable: true, want: podvol.Uncertain},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tp := newTestPlugin(t, nil)
			dir := tp.volumeDir("v")
			if err := os.MkdirAll(dir, 0o777); err != nil {
				t.Fatal(err)
			}
			if tt.ready {
				write(t, tp.readyPath("v"), "")
			}
			rc := volume.Recovery{MountPoints: map[string]bool{}}
			if tt.mounted {
				rc.MountPoints[dir] = true
			}
			if tt.nilTable {
				rc.MountPoints = nil
			}
			tp.steps = nil
			got := tp.Reconstruct(context.Background(), rc)
			want := volume.Found{Attempted: 1, Mounts: []volume.FoundMount{{
				Spec:   podvol.VolumeSpec{Name: podvol.UniqueVolumeName("kubernetes.io/empty-dir/" + string(testUID) + "-v"), Plugin: PluginName, Mode: podvol.Filesystem, Ephemeral: true},
				Volume: podvol.PodVolume{Pod: podvol.PodRef{UID: testUID}, SpecName: "v"},
				Path:   dir, State: tt.want,
			}}}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("Reconstruct (-want +got):\n%s", diff)
			}
			if len(tp.steps) != 0 {
				t.Errorf("Reconstruct changed the node: %v", tp.steps)
			}
		})
	}
}

func TestReconstructUnreadable(t *testing.T) {
	tp := newTestPlugin(t, nil)
	outside := t.TempDir()
	base := filepath.Join(tp.root, "pods", string(testUID), "volumes", escapedName)
	write(t, filepath.Join(base, "file"), "")
	if err := os.Symlink(outside, filepath.Join(base, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(base, "ok"), 0o777); err != nil {
		t.Fatal(err)
	}
	// Another pod whose emptyDir directory is a symlink, and a pod
	// directory that is a symlink: neither is followed.
	other := filepath.Join(tp.root, "pods", "other", "volumes")
	if err := os.MkdirAll(other, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(other, escapedName)); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(tp.root, "pods", string(testUID)), filepath.Join(tp.root, "pods", "linked")); err != nil {
		t.Fatal(err)
	}
	got := tp.Reconstruct(context.Background(), volume.Recovery{MountPoints: map[string]bool{}})
	if diff := cmp.Diff([]string{filepath.Join(base, "file"), filepath.Join(base, "link"), filepath.Join(tp.root, "pods", "other", "volumes", escapedName)}, got.Unreadable); diff != "" {
		t.Errorf("unreadable (-want +got):\n%s", diff)
	}
	if len(got.Mounts) != 1 || got.Mounts[0].Volume.SpecName != "ok" || got.Attempted != 4 {
		t.Errorf("mounts %v, attempted %d; want the one volume ok of 4", got.Mounts, got.Attempted)
	}
}

func TestRetake(t *testing.T) {
	tests := []struct {
		name    string
		prepare func(t *testing.T, tp *testPlugin) string // returns dir
		mounted bool
		want    bool
	}{
		{name: "an empty volume directory", want: true, prepare: func(t *testing.T, tp *testPlugin) string {
			mkdir(t, tp.volumeDir("v"))
			write(t, tp.readyPath("v"), "")
			return tp.volumeDir("v")
		}},
		{name: "a mount point", mounted: true, prepare: func(t *testing.T, tp *testPlugin) string {
			mkdir(t, tp.volumeDir("v"))
			return tp.volumeDir("v")
		}},
		{name: "holds data", prepare: func(t *testing.T, tp *testPlugin) string {
			write(t, filepath.Join(tp.volumeDir("v"), "data"), "x")
			return tp.volumeDir("v")
		}},
		{name: "a symlink", prepare: func(t *testing.T, tp *testPlugin) string {
			mkdir(t, filepath.Dir(tp.volumeDir("v")))
			if err := os.Symlink(t.TempDir(), tp.volumeDir("v")); err != nil {
				t.Fatal(err)
			}
			return tp.volumeDir("v")
		}},
		{name: "another plugin's", prepare: func(t *testing.T, tp *testPlugin) string {
			d := filepath.Join(tp.root, "pods", string(testUID), "volumes", "kubernetes.io~csi", "pv")
			mkdir(t, d)
			return d
		}},
		{name: "outside the root", prepare: func(t *testing.T, tp *testPlugin) string { return t.TempDir() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tp := newTestPlugin(t, nil)
			dir := tt.prepare(t, tp)
			if got := tp.Retake(context.Background(), dir, map[string]bool{dir: tt.mounted}); got != tt.want {
				t.Errorf("Retake = %v, want %v", got, tt.want)
			}
			if gone := !exists(t, dir); gone != tt.want {
				t.Errorf("directory gone: %v, want %v", gone, tt.want)
			}
			if tt.want && exists(t, tp.readyPath("v")) {
				t.Error("the ready file is left")
			}
		})
	}
}

func mkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}
