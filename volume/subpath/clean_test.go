package subpath

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/mount-utils"
)

// tree lists what is under dir, relative to it, sorted.
func tree(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, rel)
		}
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	return out
}

func TestCleanVolumeAndPodFake(t *testing.T) {
	ctx := context.Background()
	e := newFakeEnv(t)
	mkdirs(t, filepath.Join(e.vol, "a"))
	other := e.mount("app", 0, "a")
	other.Volume = "other"
	for _, s := range []Mount{e.mount("app", 0, "a"), e.mount("app", 4, "a"), e.mount("side", 1, "a"), other} {
		if _, err := e.m.Prepare(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.m.CleanVolume(ctx, "pod-1", "data"); err != nil {
		t.Fatal(err)
	}
	otherTarget := filepath.Join(e.root, "pods/pod-1/volume-subpaths/other/app/0")
	if got := e.mounts(); !slices.Equal(got, []string{otherTarget}) {
		t.Errorf("mounts after CleanVolume: %v, want only %s", got, otherTarget)
	}
	if got, want := tree(t, filepath.Join(e.root, "pods")), []string{"pod-1", "pod-1/volume-subpaths", "pod-1/volume-subpaths/other", "pod-1/volume-subpaths/other/app", "pod-1/volume-subpaths/other/app/0"}; !slices.Equal(got, want) {
		t.Errorf("after CleanVolume: %v, want %v", got, want)
	}
	// Idempotent, and nothing there is not an error.
	for _, clean := range []func() error{
		func() error { return e.m.CleanVolume(ctx, "pod-1", "data") },
		func() error { return e.m.CleanPod(ctx, "pod-1") },
		func() error { return e.m.CleanPod(ctx, "pod-1") },
		func() error { return e.m.CleanVolume(ctx, "pod-1", "data") },
		func() error { return e.m.CleanPod(ctx, "no-such-pod") },
	} {
		if err := clean(); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.mounts(); len(got) != 0 {
		t.Errorf("mounts after CleanPod: %v", got)
	}
	if got := tree(t, filepath.Join(e.root, "pods")); !slices.Equal(got, []string{"pod-1"}) {
		t.Errorf("after CleanPod: %v, want only the pod's directory", got)
	}
}

func TestCleanLastVolumeRemovesSubPathsDir(t *testing.T) {
	e := newFakeEnv(t)
	mkdirs(t, filepath.Join(e.vol, "a"))
	if _, err := e.m.Prepare(context.Background(), e.mount("app", 0, "a")); err != nil {
		t.Fatal(err)
	}
	if err := e.m.CleanVolume(context.Background(), "pod-1", "data"); err != nil {
		t.Fatal(err)
	}
	if got := tree(t, filepath.Join(e.root, "pods")); !slices.Equal(got, []string{"pod-1"}) {
		t.Errorf("after CleanVolume of the last volume: %v", got)
	}
}

func TestCleanLeavesWhatIsNotOurs(t *testing.T) {
	ctx := context.Background()
	e := newFakeEnv(t)
	mkdirs(t, filepath.Join(e.vol, "a"))
	for _, s := range []Mount{e.mount("app", 0, "a"), e.mount("app", 1, "a"), e.mount("app", 2, "a")} {
		if _, err := e.m.Prepare(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	outside := t.TempDir()
	mkdirs(t, filepath.Join(outside, "x"))
	dir := filepath.Join(e.root, "pods/pod-1/volume-subpaths/data")
	// Not ours: a file with data, a symlink to a directory outside the
	// root (as a container directory and as a target), and a file where
	// a container directory would be.
	write := func(p string, data string) {
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(dir, "app/7"), "data")
	write(filepath.Join(dir, "stray"), "")
	for _, l := range []string{filepath.Join(dir, "linked"), filepath.Join(dir, "app/8")} {
		if err := os.Symlink(outside, l); err != nil {
			t.Fatal(err)
		}
	}
	err := e.m.CleanVolume(ctx, "pod-1", "data")
	if err == nil {
		t.Fatal("CleanVolume succeeded with entries it must not remove")
	}
	for _, left := range []string{"app/7", "app/8", "stray", "linked", `pod pod-1 volume "data"`} {
		if !strings.Contains(err.Error(), left) {
			t.Errorf("error %q does not name %s", err, left)
		}
	}
	if got := e.mounts(); len(got) != 0 {
		t.Errorf("mounts left: %v", got)
	}
	want := []string{"data", "data/app", "data/app/7", "data/app/8", "data/linked", "data/stray"}
	if got := tree(t, filepath.Join(e.root, "pods/pod-1/volume-subpaths")); !slices.Equal(got, want) {
		t.Errorf("left: %v, want %v", got, want)
	}
	if got := tree(t, outside); !slices.Equal(got, []string{"x"}) {
		t.Errorf("outside the root: %v, want x untouched", got)
	}
}

func TestCleanStackedMounts(t *testing.T) {
	e := newFakeEnv(t)
	mkdirs(t, filepath.Join(e.vol, "a"))
	target, err := e.m.Prepare(context.Background(), e.mount("app", 0, "a"))
	if err != nil {
		t.Fatal(err)
	}
	// A second mount on the same target, as a crash between a mount and
	// its check can leave (the fake unmounts both at once; the root test
	// takes them down one by one).
	e.fake.MountPoints = append(e.fake.MountPoints, mount.MountPoint{Device: "/dev/x", Path: target})
	if err := e.m.CleanPod(context.Background(), "pod-1"); err != nil {
		t.Fatal(err)
	}
	if got := e.mounts(); len(got) != 0 {
		t.Errorf("mounts left: %v", got)
	}
}

func TestCleanRefusesBadNames(t *testing.T) {
	e := newFakeEnv(t)
	for _, tc := range []struct{ pod, volume string }{{"", "v"}, {"..", "v"}, {"p", "a/b"}, {"p", ".."}} {
		if err := e.m.CleanVolume(context.Background(), types.UID(tc.pod), tc.volume); !errors.Is(err, ErrInvalid) {
			t.Errorf("CleanVolume(%q, %q) = %v, want ErrInvalid", tc.pod, tc.volume, err)
		}
	}
	if err := e.m.CleanPod(context.Background(), "../x"); !errors.Is(err, ErrInvalid) {
		t.Errorf("CleanPod(../x) = %v, want ErrInvalid", err)
	}
}

// TestCorruptedMount: a mount whose check fails as a dead FUSE daemon's
// or a stale NFS handle's does is unmounted, by Prepare (which then mounts
// again) and by the cleans.
func TestCorruptedMount(t *testing.T) {
	ctx := context.Background()
	e := newFakeEnv(t)
	mkdirs(t, filepath.Join(e.vol, "a"))
	target, err := e.m.Prepare(ctx, e.mount("app", 0, "a"))
	if err != nil {
		t.Fatal(err)
	}
	e.fake.MountCheckErrors = map[string]error{target: syscall.ENOTCONN}
	e.fake.ResetLog()
	if _, err := e.m.Prepare(ctx, e.mount("app", 0, "a")); err != nil {
		t.Fatal(err)
	}
	if log := e.fake.GetLog(); len(log) != 2 || log[0].Action != mount.FakeActionUnmount || log[1].Action != mount.FakeActionMount {
		t.Errorf("mounter actions %+v, want an unmount and a mount", log)
	}
	e.fake.MountCheckErrors = map[string]error{target: syscall.ESTALE}
	if err := e.m.CleanPod(ctx, "pod-1"); err != nil {
		t.Fatal(err)
	}
	if got := e.mounts(); len(got) != 0 {
		t.Errorf("mounts left: %v", got)
	}
}
