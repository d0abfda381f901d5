package emptydir

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/internal/rootfs"
	"github.com/nodevol/nodevol/step"
	"github.com/nodevol/nodevol/volume"
)

func TestSetUpMedia(t *testing.T) {
	hp2 := v1.ResourceList{"hugepages-2Mi": resource.MustParse("4Mi")}
	tests := []struct {
		name   string
		pod    *v1.Pod
		src    v1.EmptyDirVolumeSource
		noswap bool
		want   []mount.MountPoint // the fake mount table after SetUp
	}{
		{name: "disk", pod: testPod(ctr(nil, nil)), src: v1.EmptyDirVolumeSource{SizeLimit: quantity("1Gi")}},
		{name: "memory, sized, noswap", pod: testPod(ctr(mem("1Gi"), mem("1Gi"))), noswap: true,
			src:  v1.EmptyDirVolumeSource{Medium: "Memory", SizeLimit: quantity("64Mi")},
			want: []mount.MountPoint{{Device: "tmpfs", Type: "tmpfs", Opts: []string{"size=67108864", "noswap"}}}},
		{name: "memory, no bound, no noswap", pod: testPod(ctr(nil, nil)), src: v1.EmptyDirVolumeSource{Medium: "Memory"},
			want: []mount.MountPoint{{Device: "tmpfs", Type: "tmpfs", Opts: []string{}}}},
		{name: "hugepages", pod: testPod(ctr(hp2, hp2)), src: v1.EmptyDirVolumeSource{Medium: "HugePages"},
			want: []mount.MountPoint{{Device: "nodev", Type: "hugetlbfs", Opts: []string{"pagesize=2Mi"}}}},
		{name: "hugepages-2Mi", pod: testPod(ctr(hp2, hp2)), src: v1.EmptyDirVolumeSource{Medium: "HugePages-2Mi"},
			want: []mount.MountPoint{{Device: "nodev", Type: "hugetlbfs", Opts: []string{"pagesize=2Mi"}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tp := newTestPlugin(t, nil)
			tp.noswap = func() bool { return tt.noswap }
			spec := tp.spec(t, tt.pod, "v", tt.src)
			got, err := tp.SetUp(context.Background(), request(spec, "v"))
			if err != nil {
				t.Fatal(err)
			}
			dir := tp.volumeDir("v")
			if got != dir {
				t.Errorf("SetUp returned %q, want %q", got, dir)
			}
			fi, err := os.Lstat(dir)
			if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o777 {
				t.Errorf("volume directory: %v, %v; want a directory with mode 0777", fi, err)
			}
			if fi, err := os.Lstat(tp.readyPath("v")); err != nil || !fi.Mode().IsRegular() {
				t.Errorf("ready file: %v, %v", fi, err)
			}
			for i := range tt.want {
				tt.want[i].Path = dir
			}
			if diff := cmp.Diff(tt.want, tp.fake.MountPoints); diff != "" {
				t.Errorf("mount table (-want +got):\n%s", diff)
			}
			// Again: a no-op.
			tp.fake.ResetLog()
			tp.steps = nil
			if _, err := tp.SetUp(context.Background(), request(spec, "v")); err != nil {
				t.Fatal(err)
			}
			if len(tp.fake.GetLog()) != 0 || len(tp.steps) != 0 {
				t.Errorf("second SetUp changed the node: mounts %v, steps %v", tp.fake.GetLog(), tp.steps)
			}
		})
	}
}

func TestSetUpUmask(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	tp := newTestPlugin(t, nil)
	spec := tp.spec(t, testPod(ctr(nil, nil)), "v", v1.EmptyDirVolumeSource{})
	if _, err := tp.SetUp(context.Background(), request(spec, "v")); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(tp.volumeDir("v")); err != nil || fi.Mode().Perm() != 0o777 {
		t.Errorf("volume directory under umask 077: %v, %v; want mode 0777", fi, err)
	}
}

// TestSetUpAgain covers the kubelet's decisions on a volume found set up,
// half set up or taken apart.
func TestSetUpAgain(t *testing.T) {
	tests := []struct {
		name       string
		medium     v1.StorageMedium
		prepare    func(t *testing.T, tp *testPlugin)
		wantMounts int // mount calls of the second SetUp
	}{
		{name: "memory after a reboot: ready, no tmpfs", medium: "Memory",
			prepare: func(t *testing.T, tp *testPlugin) { tp.fake.MountPoints = nil }, wantMounts: 1},
		{name: "memory not ready, tmpfs mounted", medium: "Memory",
			prepare: func(t *testing.T, tp *testPlugin) { rm(t, tp.readyPath("v")) }},
		{name: "memory ready, something else mounted: ready", medium: "Memory",
			prepare: func(t *testing.T, tp *testPlugin) { tp.fake.MountPoints[0].Type = "ext4" }},
		{name: "disk ready, directory gone", medium: "",
			prepare: func(t *testing.T, tp *testPlugin) { rm(t, tp.volumeDir("v")) }},
		{name: "disk not ready", medium: "",
			prepare: func(t *testing.T, tp *testPlugin) { rm(t, tp.readyPath("v")) }},
		{name: "disk, the ready file a directory", medium: "",
			prepare: func(t *testing.T, tp *testPlugin) {
				rm(t, tp.readyPath("v"))
				if err := os.Mkdir(tp.readyPath("v"), 0o700); err != nil {
					t.Fatal(err)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tp := newTestPlugin(t, nil)
			spec := tp.spec(t, testPod(ctr(mem("1Gi"), mem("1Gi"))), "v", v1.EmptyDirVolumeSource{Medium: tt.medium})
			if _, err := tp.SetUp(context.Background(), request(spec, "v")); err != nil {
				t.Fatal(err)
			}
			tt.prepare(t, tp)
			tp.fake.ResetLog()
			if _, err := tp.SetUp(context.Background(), request(spec, "v")); err != nil {
				t.Fatal(err)
			}
			if got := len(tp.fake.GetLog()); got != tt.wantMounts {
				t.Errorf("second SetUp mounted %d times (%v), want %d", got, tp.fake.GetLog(), tt.wantMounts)
			}
			if fi, err := os.Lstat(tp.readyPath("v")); err != nil || !fi.Mode().IsRegular() {
				t.Errorf("ready file: %v, %v", fi, err)
			}
			if fi, err := os.Lstat(tp.volumeDir("v")); err != nil || !fi.IsDir() {
				t.Errorf("volume directory: %v, %v", fi, err)
			}
		})
	}
}

func rm(t *testing.T, path string) {
	t.Helper()
	if err := os.RemoveAll(path); err != nil {
		t.Fatal(err)
	}
}

func TestSetUpHugePagesMismatch(t *testing.T) {
	hp := v1.ResourceList{"hugepages-2Mi": resource.MustParse("4Mi"), "hugepages-1Gi": resource.MustParse("1Gi")}
	tp := newTestPlugin(t, nil)
	spec := tp.spec(t, testPod(ctr(hp, hp)), "v", v1.EmptyDirVolumeSource{Medium: "HugePages-1Gi"})
	tp.fake.MountPoints = []mount.MountPoint{{Device: "nodev", Path: tp.volumeDir("v"), Type: "hugetlbfs", Opts: []string{"rw", "pagesize=2M"}}}
	_, err := tp.SetUp(context.Background(), request(spec, "v"))
	if err == nil || !strings.Contains(err.Error(), "pagesize '2Mi' and requested medium size '1Gi' differ") || !volume.IsUncertain(err) {
		t.Errorf("SetUp over a hugetlbfs of another page size: %v, want an Uncertain error saying the sizes differ", err)
	}
	if exists(t, tp.readyPath("v")) {
		t.Error("ready file written")
	}
	// The same page size: nothing to mount.
	tp.fake.MountPoints[0].Opts = []string{"rw", "pagesize=1024M"}
	tp.fake.ResetLog()
	if _, err := tp.SetUp(context.Background(), request(spec, "v")); err != nil || len(tp.fake.GetLog()) != 0 {
		t.Errorf("SetUp over a hugetlbfs of the page size: %v, mounts %v", err, tp.fake.GetLog())
	}
}

func TestSetUpErrors(t *testing.T) {
	tp := newTestPlugin(t, nil)
	unresolved := tp.spec(t, nil, "v", v1.EmptyDirVolumeSource{Medium: "Memory"})
	_, err := tp.SetUp(context.Background(), request(unresolved, "v"))
	if err == nil || !strings.Contains(err.Error(), "was not resolved") || volume.IsUncertain(err) {
		t.Errorf("SetUp of an unresolved memory volume: %v", err)
	}
	bad := request(tp.spec(t, nil, "v", v1.EmptyDirVolumeSource{}), "../x")
	if _, err := tp.SetUp(context.Background(), bad); err == nil {
		t.Error("SetUp of a volume named ../x: no error")
	}
	if exists(t, tp.root+"/pods") {
		t.Error("something was created")
	}
	// A refused mount leaves the volume Uncertain and not ready.
	spec := tp.spec(t, testPod(ctr(nil, nil)), "m", v1.EmptyDirVolumeSource{Medium: "Memory"})
	p, err := newPlugin(Config{RootDir: tp.root, Mounter: tp.fake, Steps: func(s step.Step) error {
		if s.Op == step.Mount {
			return errors.New("refused")
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.SetUp(context.Background(), request(spec, "m")); !volume.IsUncertain(err) {
		t.Errorf("SetUp with the mount refused: %v, want Uncertain", err)
	}
	if exists(t, tp.readyPath("m")) {
		t.Error("ready file written")
	}
}

func TestSetUpOwnership(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("changing a file's group to another needs root")
	}
	tests := []struct {
		name           string
		change         bool
		onRootMismatch bool
		preset         bool // the root has the group already
		wantFileGroup  uint32
	}{
		{name: "changed", change: true, wantFileGroup: 4321},
		{name: "not asked", change: false, wantFileGroup: 0},
		{name: "OnRootMismatch, root right: nothing", change: true, onRootMismatch: true, preset: true, wantFileGroup: 0},
		{name: "Always, root right: walked", change: true, preset: true, wantFileGroup: 4321},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tp := newTestPlugin(t, nil)
			spec := tp.spec(t, testPod(ctr(nil, nil)), "v", v1.EmptyDirVolumeSource{})
			dir := tp.volumeDir("v")
			if err := os.MkdirAll(dir, 0o777); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dir+"/f", nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if tt.preset {
				if err := os.Chown(dir, 0, 4321); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(dir, 0o777|os.ModeSetgid); err != nil {
					t.Fatal(err)
				}
			}
			req := request(spec, "v")
			gid := int64(4321)
			req.Volume.FSGroup, req.Volume.FSGroupOnRootMismatch, req.ChangeOwnership = &gid, tt.onRootMismatch, tt.change
			if _, err := tp.SetUp(context.Background(), req); err != nil {
				t.Fatal(err)
			}
			fi, err := os.Lstat(dir + "/f")
			if err != nil {
				t.Fatal(err)
			}
			if g := fi.Sys().(*syscall.Stat_t).Gid; g != tt.wantFileGroup {
				t.Errorf("file group %d, want %d", g, tt.wantFileGroup)
			}
			di, _ := os.Lstat(dir)
			if tt.change && (di.Sys().(*syscall.Stat_t).Gid != 4321 || di.Mode()&os.ModeSetgid == 0) {
				t.Errorf("volume root %v gid %d, want group 4321 and setgid", di.Mode(), di.Sys().(*syscall.Stat_t).Gid)
			}
		})
	}
}

// TestSetUpRefusesPlantedSymlinks plants a symlink to a directory outside
// the root where SetUp makes a directory (the plugin's directory above the
// volume, the volume's directory, the ready file's directory): SetUp
// fails with rootfs.ErrSymlink, nothing is made outside and nothing is
// mounted, on disk and in memory (where the mount is handed the path that
// makeDir resolved, with no Verify of its own).
func TestSetUpRefusesPlantedSymlinks(t *testing.T) {
	for _, medium := range []v1.StorageMedium{"", v1.StorageMediumMemory} {
		for _, at := range []string{"parent", "volume", "readyDir"} {
			t.Run(string(medium)+"/"+at, func(t *testing.T) {
				tp := newTestPlugin(t, nil)
				outside := t.TempDir()
				link := map[string]string{
					"parent":   filepath.Dir(tp.volumeDir("v")),
					"volume":   tp.volumeDir("v"),
					"readyDir": filepath.Dir(tp.readyPath("v")),
				}[at]
				if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(outside, link); err != nil {
					t.Fatal(err)
				}
				spec := tp.spec(t, testPod(ctr(nil, nil)), "v", v1.EmptyDirVolumeSource{Medium: medium})
				_, err := tp.SetUp(context.Background(), request(spec, "v"))
				if !errors.Is(err, rootfs.ErrSymlink) {
					t.Fatalf("SetUp: %v, want rootfs.ErrSymlink", err)
				}
				if entries, _ := os.ReadDir(outside); len(entries) > 0 {
					t.Errorf("made outside the root: %v", entries)
				}
				if at != "readyDir" && len(tp.fake.MountPoints) > 0 {
					t.Errorf("mounted through the symlink: %v", tp.fake.MountPoints)
				}
			})
		}
	}
}
