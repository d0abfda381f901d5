package rootfs

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestLstatAsOs: Lstat and Stat describe a file as os.Lstat does, its
// stat_t included.
func TestLstatAsOs(t *testing.T) {
	r, _ := setup(t)
	mkdir(t, filepath.Join(r.Path(), "dir"))
	writeFile(t, filepath.Join(r.Path(), "dir/file"), "content")
	symlink(t, "file", filepath.Join(r.Path(), "dir/link"))
	if err := syscall.Mkfifo(filepath.Join(r.Path(), "dir/fifo"), 0o640); err != nil {
		t.Fatal(err)
	}
	sgid := filepath.Join(r.Path(), "dir/sgid")
	mkdir(t, sgid)
	if err := os.Chmod(sgid, 0o2770|os.ModeSetgid|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"dir", "dir/file", "dir/link", "dir/fifo", "dir/sgid"} {
		want, err := os.Lstat(filepath.Join(r.Path(), name))
		if err != nil {
			t.Fatal(err)
		}
		got, err := r.Lstat(name)
		if err != nil {
			t.Fatalf("Lstat(%s): %v", name, err)
		}
		if got.Name() != want.Name() || got.Mode() != want.Mode() || got.Size() != want.Size() ||
			!got.ModTime().Equal(want.ModTime()) || got.IsDir() != want.IsDir() {
			t.Errorf("Lstat(%s) = %s %v %d %v %v, want %s %v %d %v %v", name, got.Name(), got.Mode(), got.Size(), got.ModTime(), got.IsDir(),
				want.Name(), want.Mode(), want.Size(), want.ModTime(), want.IsDir())
		}
		gst, ok := got.Sys().(*syscall.Stat_t)
		if wst := want.Sys().(*syscall.Stat_t); !ok || gst.Dev != wst.Dev || gst.Ino != wst.Ino {
			t.Errorf("Lstat(%s).Sys() = %v, want the stat_t of the file", name, got.Sys())
		}
	}
}
