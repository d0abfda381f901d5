package emptydir

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/internal/roottest"
	"github.com/nodevol/nodevol/volume"
)

// TestRootSymlinkOutside: symlinks the pod planted in its volume, to a
// directory and a file outside, go as links; what they point to stays.
func TestRootSymlinkOutside(t *testing.T) {
	for _, medium := range []v1.StorageMedium{"", "Memory"} {
		t.Run("medium "+string(medium), func(t *testing.T) {
			p := rootPlugin(t, "")
			outside := t.TempDir()
			write(t, filepath.Join(outside, "keep"), "keep")
			write(t, filepath.Join(outside, "sub/keep"), "keep")
			spec := resolved(t, p, testPod(ctr(nil, nil)), "v", v1.EmptyDirVolumeSource{Medium: medium})
			dir, err := p.SetUp(context.Background(), request(spec, "v"))
			if err != nil {
				t.Fatal(err)
			}
			write(t, filepath.Join(dir, "d/data"), "x")
			for link, target := range map[string]string{"escape": outside, "d/file": filepath.Join(outside, "keep"), "d/sub": filepath.Join(outside, "sub")} {
				if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
					t.Fatal(err)
				}
			}
			if err := p.TearDown(context.Background(), request(spec, "v")); err != nil {
				t.Fatal(err)
			}
			checkNothingLeft(t, p, "v")
			for _, f := range []string{"keep", "sub/keep"} {
				if b, err := os.ReadFile(filepath.Join(outside, f)); err != nil || string(b) != "keep" {
					t.Errorf("%s outside the volume: %q, %v", f, b, err)
				}
			}
		})
	}
}

// TestRootMountInside: a mount inside the volume makes TearDown refuse
// before it changes anything, whether or not the mounter's table knows it
// (the walk finds its root), and the remover, should a mount be made
// after that check, stops at the mount's root; the mounted data stays
// either way.
func TestRootMountInside(t *testing.T) {
	p := rootPlugin(t, "")
	spec := resolved(t, p, testPod(ctr(nil, nil)), "v", v1.EmptyDirVolumeSource{})
	dir, err := p.SetUp(context.Background(), request(spec, "v"))
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	write(t, filepath.Join(src, "data"), "precious")
	sub := filepath.Join(dir, "a", "sub")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(src, sub, "", syscall.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	ready := filepath.Join(p.root, "pods", string(testUID), "plugins", escapedName, "v", readyFile)
	blind, err := newPlugin(Config{RootDir: p.root, Mounter: mount.NewFakeMounter(nil)})
	if err != nil {
		t.Fatal(err)
	}
	for name, q := range map[string]*plugin{"the mounter's table": p, "a fake mounter's empty table": blind} {
		err = q.TearDown(context.Background(), request(spec, "v"))
		if !errors.Is(err, errOtherMount) || !strings.Contains(err.Error(), sub) || volume.IsUncertain(err) {
			t.Errorf("TearDown over a mount inside, with %s: %v, want a refusal naming %s", name, err, sub)
		}
		if !exists(t, ready) {
			t.Errorf("the refusal, with %s, removed the ready file", name)
		}
	}
	// The remover's own check: a mount made after mountsBelow looked.
	at, err := p.volumePaths(testUID, "v")
	if err != nil {
		t.Fatal(err)
	}
	err = p.removeVolumeDir(context.Background(), at)
	if !errors.Is(err, errOtherMount) || !strings.Contains(err.Error(), sub) {
		t.Errorf("removeVolumeDir over a mount inside: %v, want a refusal naming %s", err, sub)
	}
	if b, err := os.ReadFile(filepath.Join(src, "data")); err != nil || string(b) != "precious" {
		t.Fatalf("the mounted data: %q, %v", b, err)
	}
	if err := syscall.Unmount(sub, 0); err != nil {
		t.Fatal(err)
	}
	if err := p.TearDown(context.Background(), request(spec, "v")); err != nil {
		t.Fatal(err)
	}
	checkNothingLeft(t, p, "v")
}

// TestRootBindMountAt: a bind mount of a directory of the same file system
// at the volume's directory, which a comparison of devices would miss, is
// seen at it (the statx of its mount root), so the mount table is read for
// its type.
func TestRootBindMountAt(t *testing.T) {
	p := rootPlugin(t, "")
	spec := resolved(t, p, testPod(ctr(nil, nil)), "v", v1.EmptyDirVolumeSource{})
	dir, err := p.SetUp(context.Background(), request(spec, "v"))
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(p.root, "elsewhere")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(src, dir, "", syscall.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	at, err := p.volumePaths(testUID, "v")
	if err != nil {
		t.Fatal(err)
	}
	mounts, table, err := p.mountsAt(at)
	if err != nil || len(mounts) != 1 || table == nil {
		t.Errorf("mountsAt over a bind mount of the same file system: %d mounts, table read %v, %v; want 1, true", len(mounts), table != nil, err)
	}
	if err := syscall.Unmount(dir, 0); err != nil {
		t.Fatal(err)
	}
	if mounts, table, err := p.mountsAt(at); err != nil || len(mounts) != 0 || table != nil {
		t.Errorf("mountsAt once unmounted: %d mounts, table read %v, %v; want 0, false", len(mounts), table != nil, err)
	}
}

// TestRootTearDownWithoutTable: on a real node a volume's teardown does not
// read the node's mount table, which grows with its pods: a memory
// volume's tmpfs is known from its directory (a statx and an fstatfs),
// and what is below it from a walk.
func TestRootTearDownWithoutTable(t *testing.T) {
	for _, medium := range []v1.StorageMedium{"", "Memory"} {
		t.Run("medium "+string(medium), func(t *testing.T) {
			p := rootPlugin(t, "")
			c := &listCounter{Interface: p.mounter}
			p.mounter = c
			spec := resolved(t, p, testPod(ctr(nil, nil)), "v", v1.EmptyDirVolumeSource{Medium: medium})
			dir, err := p.SetUp(context.Background(), request(spec, "v"))
			if err != nil {
				t.Fatal(err)
			}
			write(t, filepath.Join(dir, "a/b/data"), "x")
			if err := p.TearDown(context.Background(), request(spec, "v")); err != nil {
				t.Fatal(err)
			}
			checkNothingLeft(t, p, "v")
			if c.lists != 0 {
				t.Errorf("SetUp and TearDown read the mount table %d times, want 0", c.lists)
			}
		})
	}
}

// TestRootStackedMounts: what is mounted at a memory volume's directory
// beside its own tmpfs. A tmpfs stacked on it goes too; another file
// system at the directory is refused before anything changes; one under
// the volume's tmpfs, which only the mount table shows, is refused once
// the tmpfs is unmounted (Uncertain), and by the next TearDown before
// anything changes. Its data stays either way.
func TestRootStackedMounts(t *testing.T) {
	bind := func(t *testing.T, p *plugin, dir string) string {
		t.Helper()
		src := filepath.Join(p.root, "elsewhere")
		write(t, filepath.Join(src, "data"), "precious")
		if err := syscall.Mount(src, dir, "", syscall.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
		return src
	}
	tmpfs := func(t *testing.T, dir string) {
		t.Helper()
		if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name string
		// stack mounts at the set-up volume's directory, and returns
		// a directory whose data must stay ("" for none).
		stack func(t *testing.T, p *plugin, dir string) string
		// medium is the volume's.
		medium v1.StorageMedium
		// refused: the first TearDown refuses; uncertain: once it has
		// changed something.
		refused, uncertain bool
	}{
		{name: "tmpfs on the volume's", medium: "Memory", stack: func(t *testing.T, p *plugin, dir string) string {
			tmpfs(t, dir)
			return ""
		}},
		{name: "another file system at a disk volume", stack: bind, refused: true},
		{name: "another file system at a memory volume", medium: "Memory", stack: bind, refused: true},
		{name: "tmpfs on another file system", stack: func(t *testing.T, p *plugin, dir string) string {
			src := bind(t, p, dir)
			tmpfs(t, dir)
			return src
		}, refused: true, uncertain: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := rootPlugin(t, "")
			spec := resolved(t, p, testPod(ctr(nil, nil)), "v", v1.EmptyDirVolumeSource{Medium: tt.medium})
			dir, err := p.SetUp(context.Background(), request(spec, "v"))
			if err != nil {
				t.Fatal(err)
			}
			keep := tt.stack(t, p, dir)
			ready := filepath.Join(p.root, "pods", string(testUID), "plugins", escapedName, "v", readyFile)
			err = p.TearDown(context.Background(), request(spec, "v"))
			if !tt.refused {
				if err != nil {
					t.Fatal(err)
				}
				checkNothingLeft(t, p, "v")
				return
			}
			if !errors.Is(err, errOtherMount) || !strings.Contains(err.Error(), dir) || volume.IsUncertain(err) != tt.uncertain {
				t.Errorf("TearDown: %v, want a refusal naming %s, Uncertain %v", err, dir, tt.uncertain)
			}
			if left := exists(t, ready); left == tt.uncertain {
				t.Errorf("ready file left after the refusal: %v, want %v", left, !tt.uncertain)
			}
			// Refused again, before anything changes.
			err = p.TearDown(context.Background(), request(spec, "v"))
			if !errors.Is(err, errOtherMount) || volume.IsUncertain(err) {
				t.Errorf("TearDown again: %v, want a refusal that changed nothing", err)
			}
			if b, err := os.ReadFile(filepath.Join(keep, "data")); err != nil || string(b) != "precious" {
				t.Fatalf("the other file system's data: %q, %v", b, err)
			}
			m := mountsUnder(t, p.root)
			if len(m) == 0 || m[len(m)-1].path != dir || m[len(m)-1].fstype == tmpfsType {
				t.Fatalf("mounts left at the volume: %+v, want the other file system's on top", m)
			}
			if err := syscall.Unmount(dir, 0); err != nil {
				t.Fatal(err)
			}
			if err := p.TearDown(context.Background(), request(spec, "v")); err != nil {
				t.Fatal(err)
			}
			checkNothingLeft(t, p, "v")
			if b, err := os.ReadFile(filepath.Join(keep, "data")); err != nil || string(b) != "precious" {
				t.Errorf("the other file system's data: %q, %v", b, err)
			}
		})
	}
}

// TestRootMounterSaysOther: the directory's own word (a tmpfs, from its
// fstatfs) counts only where the kernel says it is a mount's root. On a
// node whose root is on a tmpfs, a plain volume directory is on a tmpfs
// too: a mounter that lists another file system at it is believed, and
// the teardown refused.
func TestRootMounterSaysOther(t *testing.T) {
	roottest.Require(t)
	root := t.TempDir()
	if err := syscall.Mount("tmpfs", root, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(root, syscall.MNT_DETACH) })
	fake := mount.NewFakeMounter(nil)
	p, err := newPlugin(Config{RootDir: root, Mounter: fake})
	if err != nil {
		t.Fatal(err)
	}
	spec := resolved(t, p, testPod(ctr(nil, nil)), "v", v1.EmptyDirVolumeSource{})
	dir, err := p.SetUp(context.Background(), request(spec, "v"))
	if err != nil {
		t.Fatal(err)
	}
	fake.MountPoints = append(fake.MountPoints, mount.MountPoint{Device: "/dev/sdz", Path: dir, Type: "ext4"})
	err = p.TearDown(context.Background(), request(spec, "v"))
	if !errors.Is(err, errOtherMount) || volume.IsUncertain(err) {
		t.Errorf("TearDown under another file system the mounter lists: %v, want a refusal that changed nothing", err)
	}
	if !exists(t, dir) {
		t.Error("the refusal removed the volume's directory")
	}
}
