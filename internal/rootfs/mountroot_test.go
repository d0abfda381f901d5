package rootfs

import (
	"errors"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/nodevol/nodevol/internal/roottest"
)

// TestMountRoot (root): a bind mount of a directory and of a file, on the
// root's own file system, are mount roots; a plain directory and file are
// not, nor is a symlink to a mount point (not followed); a symlink above
// the name is refused.
func TestMountRoot(t *testing.T) {
	roottest.Require(t)
	r, outside := setup(t)
	mkdir(t, filepath.Join(r.Path(), "dir"))
	if _, known, err := r.MountRoot("dir"); err != nil || !known {
		t.Skipf("the kernel does not mark mount roots (before Linux 5.8): %v", err)
	}
	mkdir(t, filepath.Join(r.Path(), "mnt"))
	writeFile(t, filepath.Join(r.Path(), "file"), "x")
	writeFile(t, filepath.Join(r.Path(), "filemnt"), "")
	symlink(t, "mnt", filepath.Join(r.Path(), "link"))
	symlink(t, outside, filepath.Join(r.Path(), "out"))
	for _, m := range []struct{ src, dst string }{{filepath.Join(r.Path(), "dir"), "mnt"}, {filepath.Join(r.Path(), "file"), "filemnt"}} {
		dst := filepath.Join(r.Path(), m.dst)
		if err := syscall.Mount(m.src, dst, "", syscall.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = syscall.Unmount(dst, syscall.MNT_DETACH) })
	}
	for _, tt := range []struct {
		name string
		want bool
	}{{"dir", false}, {"file", false}, {"mnt", true}, {"filemnt", true}, {"link", false}} {
		got, known, err := r.MountRoot(tt.name)
		if err != nil || !known || got != tt.want {
			t.Errorf("MountRoot(%s) = %v, known %v, %v; want %v", tt.name, got, known, err, tt.want)
		}
	}
	if _, _, err := r.MountRoot("out/x"); !errors.Is(err, ErrSymlink) {
		t.Errorf("MountRoot through a symlink: %v, want ErrSymlink", err)
	}
}
