package subpath

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/internal/roottest"
	"github.com/nodevol/nodevol/step"
)

// rootEnv is a root directory and a volume on a real tmpfs, with a
// directory outside both that a pod's symlink points to.
type rootEnv struct {
	base, root, vol, outside string
	// onStep, when set, runs at each step before it is taken.
	onStep func(step.Step)
}

func newRootEnv(t *testing.T) *rootEnv {
	t.Helper()
	roottest.Require(t)
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	e := &rootEnv{base: base, root: filepath.Join(base, "root"), vol: filepath.Join(base, "vol"), outside: filepath.Join(base, "outside")}
	mkdirs(t, e.vol, filepath.Join(e.outside, "d"))
	if err := os.WriteFile(filepath.Join(e.outside, "d", "secret"), []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", e.vol, "tmpfs", 0, "size=8m,mode=0755"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		left := mountsUnder(t, base)
		for i := len(left) - 1; i >= 0; i-- {
			_ = unix.Unmount(left[i].MountPoint, unix.MNT_DETACH)
		}
	})
	return e
}

func (e *rootEnv) manager(t *testing.T) *Manager {
	t.Helper()
	m, err := New(Config{RootDir: e.root, Mounter: mount.New(""), Steps: func(s step.Step) error {
		if e.onStep != nil {
			e.onStep(s)
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func (e *rootEnv) mount(container string, index int, subPath string) Mount {
	return Mount{Pod: "pod-1", Volume: "data", VolumePath: e.vol, Container: container, Index: index, SubPath: subPath}
}

// mountsUnder returns the mounts at or below dir, in mount order.
func mountsUnder(t *testing.T, dir string) []mount.MountInfo {
	t.Helper()
	all, err := mount.ParseMountInfo("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []mount.MountInfo
	for _, mi := range all {
		if mi.MountPoint == dir || strings.HasPrefix(mi.MountPoint, dir+"/") {
			out = append(out, mi)
		}
	}
	return out
}

// subPathMounts returns "{mount point relative to the root} {root in
// the volume's tmpfs}" for each mount under the root.
func (e *rootEnv) subPathMounts(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, mi := range mountsUnder(t, e.root) {
		rel, _ := filepath.Rel(e.root, mi.MountPoint)
		out = append(out, rel+" "+mi.Root+" "+mi.FsType)
	}
	return out
}

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestRootPrepareAndClean(t *testing.T) {
	ctx := context.Background()
	e := newRootEnv(t)
	mkdirs(t, filepath.Join(e.vol, "a/b"))
	write(t, filepath.Join(e.vol, "a/b/hello"), "dir")
	write(t, filepath.Join(e.vol, "a/f"), "file")
	m := e.manager(t)
	for range 2 { // the second round reuses the mounts
		dirTarget, err := m.Prepare(ctx, e.mount("app", 0, "a/b"))
		if err != nil {
			t.Fatal(err)
		}
		fileTarget, err := m.Prepare(ctx, e.mount("app", 1, "a/f"))
		if err != nil {
			t.Fatal(err)
		}
		want := []string{
			"pods/pod-1/volume-subpaths/data/app/0 /a/b tmpfs",
			"pods/pod-1/volume-subpaths/data/app/1 /a/f tmpfs",
		}
		if got := e.subPathMounts(t); !slices.Equal(got, want) {
			t.Fatalf("mounts:\n%q\nwant:\n%q", got, want)
		}
		if b, err := os.ReadFile(filepath.Join(dirTarget, "hello")); err != nil || string(b) != "dir" {
			t.Errorf("through the directory mount: %q, %v", b, err)
		}
		if b, err := os.ReadFile(fileTarget); err != nil || string(b) != "file" {
			t.Errorf("through the file mount: %q, %v", b, err)
		}
	}
	if _, err := m.Prepare(ctx, e.mount("side", 0, "new/dir")); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(filepath.Join(e.vol, "new/dir")); err != nil || !fi.IsDir() {
		t.Errorf("the missing subPath was not created as a directory: %v", err)
	}
	if err := m.CleanVolume(ctx, "pod-1", "data"); err != nil {
		t.Fatal(err)
	}
	e.checkClean(t)
}

// checkClean checks that nothing is mounted under the root and nothing is
// left of the pod's subPath directories.
func (e *rootEnv) checkClean(t *testing.T) {
	t.Helper()
	if got := e.subPathMounts(t); len(got) != 0 {
		t.Errorf("mounts left: %q", got)
	}
	if got := tree(t, filepath.Join(e.root, "pods")); len(got) > 1 {
		t.Errorf("left under pods/: %q", got)
	}
}

// TestRootSwapBeforeMount swaps a component of the subPath for a symlink
// out of the volume after Prepare opened it and before it mounts: the
// mount is of the directory Prepare opened, never of the symlink's target.
func TestRootSwapBeforeMount(t *testing.T) {
	for _, tc := range []struct {
		name     string
		swap     string // the component swapped (renamed to moved, a symlink put in its place)
		to       string // the symlink's target
		wantRoot string // the mount's root in the volume's tmpfs
	}{
		{name: "last component", swap: "x/d", to: "OUTSIDE/d", wantRoot: "/x/moved"},
		{name: "middle component", swap: "x", to: "OUTSIDE", wantRoot: "/moved/d"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newRootEnv(t)
			mkdirs(t, filepath.Join(e.vol, "x/d"))
			write(t, filepath.Join(e.vol, "x/d/mine"), "pod")
			m := e.manager(t)
			swapped := false
			e.onStep = func(s step.Step) {
				if s.Op != step.Mount || swapped {
					return
				}
				swapped = true
				from := filepath.Join(e.vol, tc.swap)
				if err := os.Rename(from, filepath.Join(filepath.Dir(from), "moved")); err != nil {
					t.Error(err)
				}
				if err := os.Symlink(strings.Replace(tc.to, "OUTSIDE", e.outside, 1), from); err != nil {
					t.Error(err)
				}
			}
			target, err := m.Prepare(context.Background(), e.mount("app", 0, "x/d"))
			if !swapped {
				t.Fatal("the hook did not run before the mount")
			}
			if err != nil {
				t.Fatalf("Prepare: %v", err)
			}
			want := []string{"pods/pod-1/volume-subpaths/data/app/0 " + tc.wantRoot + " tmpfs"}
			if got := e.subPathMounts(t); !slices.Equal(got, want) {
				t.Fatalf("mounts %q, want %q", got, want)
			}
			if got := tree(t, target); !slices.Equal(got, []string{"mine"}) {
				t.Errorf("through the mount: %q, want the opened directory's [mine]", got)
			}
			if err := m.CleanPod(context.Background(), "pod-1"); err != nil {
				t.Fatal(err)
			}
			e.checkClean(t)
			if got := tree(t, e.outside); !slices.Equal(got, []string{"d", "d/secret"}) {
				t.Errorf("outside changed: %q", got)
			}
		})
	}
}

func TestRootStaleMountReplaced(t *testing.T) {
	e := newRootEnv(t)
	mkdirs(t, filepath.Join(e.vol, "a"), filepath.Join(e.vol, "b"))
	m := e.manager(t)
	for _, subPath := range []string{"a", "b"} {
		if _, err := m.Prepare(context.Background(), e.mount("app", 0, subPath)); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"pods/pod-1/volume-subpaths/data/app/0 /b tmpfs"}
	if got := e.subPathMounts(t); !slices.Equal(got, want) {
		t.Errorf("mounts %q, want %q", got, want)
	}
	if err := m.CleanPod(context.Background(), "pod-1"); err != nil {
		t.Fatal(err)
	}
	e.checkClean(t)
}

// TestRootStaleMountInUseDetached: a stale subPath mount that is still in
// use (a file open in it, as an exited container's hung FUSE flush holds
// one) is detached, not unmounted, as the kubelet 1.37 does: Prepare binds
// the new file in its place at once, and the open file stays readable.
func TestRootStaleMountInUseDetached(t *testing.T) {
	e := newRootEnv(t)
	mkdirs(t, filepath.Join(e.vol, "a"), filepath.Join(e.vol, "b"))
	write(t, filepath.Join(e.vol, "a", "f"), "old")
	m := e.manager(t)
	target, err := m.Prepare(context.Background(), e.mount("app", 0, "a"))
	if err != nil {
		t.Fatal(err)
	}
	held, err := os.Open(filepath.Join(target, "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if _, err := m.Prepare(context.Background(), e.mount("app", 0, "b")); err != nil {
		t.Fatalf("Prepare over a stale mount in use: %v", err)
	}
	want := []string{"pods/pod-1/volume-subpaths/data/app/0 /b tmpfs"}
	if got := e.subPathMounts(t); !slices.Equal(got, want) {
		t.Errorf("mounts %q, want %q", got, want)
	}
	if data, err := io.ReadAll(held); err != nil || string(data) != "old" {
		t.Errorf("the file held open in the detached mount reads %q, %v", data, err)
	}
	held.Close()
	if err := m.CleanPod(context.Background(), "pod-1"); err != nil {
		t.Fatal(err)
	}
	e.checkClean(t)
}

// TestRootLeftoverAfterCrash drops a Manager with its bind mounts made
// (and one mounted twice over, as a crash between a mount and its check
// leaves it): a new Manager reuses them, and cleans them all.
func TestRootLeftoverAfterCrash(t *testing.T) {
	ctx := context.Background()
	e := newRootEnv(t)
	mkdirs(t, filepath.Join(e.vol, "a"))
	write(t, filepath.Join(e.vol, "f"), "")
	first := e.manager(t)
	dirTarget, err := first.Prepare(ctx, e.mount("app", 0, "a"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.Prepare(ctx, e.mount("init", 2, "f")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(filepath.Join(e.vol, "a"), dirTarget, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	before := e.subPathMounts(t)
	if len(before) != 3 {
		t.Fatalf("mounts before the restart: %q", before)
	}

	second := e.manager(t)
	if _, err := second.Prepare(ctx, e.mount("app", 0, "a")); err != nil {
		t.Fatal(err)
	}
	if got := e.subPathMounts(t); !slices.Equal(got, before) {
		t.Errorf("Prepare after the restart changed the mounts: %q, were %q", got, before)
	}
	if err := second.CleanPod(ctx, "pod-1"); err != nil {
		t.Fatal(err)
	}
	e.checkClean(t)
}
