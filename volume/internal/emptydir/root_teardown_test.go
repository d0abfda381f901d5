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
