package rootfs

import (
	"errors"
	"io"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func TestVerify(t *testing.T) {
	both(t, func(t *testing.T) {
		r, outside := setup(t)
		mkdir(t, filepath.Join(r.Path(), "pods/uid/volumes"))
		writeFile(t, filepath.Join(r.Path(), "pods/uid/file"), "x")
		for _, name := range []string{"pods/uid/volumes", "pods/uid/volumes/missing", "pods/missing/a/b", "pods/uid/file", "."} {
			got, err := r.Verify(name)
			if want, _ := r.Join(name); err != nil || got != want {
				t.Errorf("Verify(%s) = %q, %v; want %s", name, got, err, want)
			}
		}
		symlink(t, outside, filepath.Join(r.Path(), "pods/uid/volumes/mount"))
		_, err := r.Verify("pods/uid/volumes/mount")
		assertSymlinkErr(t, err, filepath.Join(r.Path(), "pods/uid/volumes/mount"))
		_, err = r.Verify("pods/uid/volumes/mount/x")
		assertSymlinkErr(t, err, filepath.Join(r.Path(), "pods/uid/volumes/mount"))
		if _, err := r.Verify("pods/uid/file/x"); !errors.Is(err, ErrNotDir) {
			t.Errorf("Verify below a file = %v, want ErrNotDir", err)
		}
		// A dangling symlink is refused too.
		symlink(t, filepath.Join(outside, "nothing"), filepath.Join(r.Path(), "pods/dangling"))
		_, err = r.Verify("pods/dangling")
		assertSymlinkErr(t, err, filepath.Join(r.Path(), "pods/dangling"))
		assertTree(t, outside)
	})
}

func TestStat(t *testing.T) {
	both(t, func(t *testing.T) {
		r, outside := setup(t)
		writeFile(t, filepath.Join(outside, "secret"), "x")
		writeFile(t, filepath.Join(r.Path(), "a/file"), "abc")
		symlink(t, outside, filepath.Join(r.Path(), "a/link"))
		fi, err := r.Lstat("a/file")
		if err != nil || !fi.Mode().IsRegular() || fi.Size() != 3 || fi.Name() != "file" {
			t.Errorf("Lstat(a/file) = %v, %v", fi, err)
		}
		if fi, err := r.Lstat("a/link"); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			t.Errorf("Lstat(a/link) = %v, %v; want the symlink itself", fi, err)
		}
		if fi, err := r.Stat("a"); err != nil || !fi.IsDir() {
			t.Errorf("Stat(a) = %v, %v", fi, err)
		}
		_, err = r.Stat("a/link")
		assertSymlinkErr(t, err, filepath.Join(r.Path(), "a/link"))
		_, err = r.Lstat("a/link/secret")
		assertSymlinkErr(t, err, filepath.Join(r.Path(), "a/link"))
		if _, err := r.Lstat("a/missing"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Lstat(a/missing) = %v, want ErrNotExist", err)
		}
		if _, err := r.Stat("a/missing/x"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Stat(a/missing/x) = %v, want ErrNotExist", err)
		}
	})
}

func TestReadDir(t *testing.T) {
	both(t, func(t *testing.T) {
		r, outside := setup(t)
		writeFile(t, filepath.Join(outside, "secret"), "x")
		mkdir(t, filepath.Join(r.Path(), "pods/b"))
		mkdir(t, filepath.Join(r.Path(), "pods/a"))
		writeFile(t, filepath.Join(r.Path(), "pods/c"), "")
		symlink(t, outside, filepath.Join(r.Path(), "pods/d"))
		entries, err := r.ReadDir("pods")
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range entries {
			got = append(got, e.Name()+":"+e.Type().String())
		}
		if want := []string{"a:d---------", "b:d---------", "c:----------", "d:L---------"}; !slices.Equal(got, want) {
			t.Errorf("ReadDir(pods) = %v, want %v", got, want)
		}
		_, err = r.ReadDir("pods/d")
		assertSymlinkErr(t, err, filepath.Join(r.Path(), "pods/d"))
		if _, err := r.ReadDir("pods/c"); !errors.Is(err, ErrNotDir) {
			t.Errorf("ReadDir of a file = %v, want ErrNotDir", err)
		}
		if entries, err := r.ReadDir("."); err != nil || len(entries) != 1 {
			t.Errorf("ReadDir(.) = %v, %v", entries, err)
		}
		d, err := r.OpenDir("pods/a")
		if err != nil {
			t.Fatal(err)
		}
		d.Close()
		_, err = r.OpenDir("pods/d")
		assertSymlinkErr(t, err, filepath.Join(r.Path(), "pods/d"))
		if _, err := r.OpenDir("pods/c"); !errors.Is(err, ErrNotDir) {
			t.Errorf("OpenDir of a file = %v, want ErrNotDir", err)
		}
	})
}

func TestOpen(t *testing.T) {
	both(t, func(t *testing.T) {
		r, outside := setup(t)
		writeFile(t, filepath.Join(outside, "secret"), "secret")
		writeFile(t, filepath.Join(r.Path(), "a/file"), "content")
		symlink(t, filepath.Join(outside, "secret"), filepath.Join(r.Path(), "a/link"))
		symlink(t, outside, filepath.Join(r.Path(), "b"))
		f, err := r.Open("a/file")
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(f)
		f.Close()
		if err != nil || string(data) != "content" {
			t.Errorf("read %q, %v", data, err)
		}
		_, err = r.Open("a/link")
		assertSymlinkErr(t, err, filepath.Join(r.Path(), "a/link"))
		_, err = r.Open("b/secret")
		assertSymlinkErr(t, err, filepath.Join(r.Path(), "b"))
		if _, err := r.Open("a"); err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("Open(a directory) = %v, want an error", err)
		}
		// A FIFO neither blocks nor is read.
		if err := unix.Mkfifo(filepath.Join(r.Path(), "a/fifo"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Open("a/fifo"); err == nil {
			t.Error("Open(a FIFO) succeeded")
		}
	})
}

// TestBriefOpensHoldForks: Verify, Lstat and Stat keep their descriptor
// open only while holding syscall.ForkLock, so that a mount or umount
// command forked meanwhile by another goroutine cannot start with a copy
// of it, which would pin the mount they look at and make its unmount fail
// with "target is busy".
func TestBriefOpensHoldForks(t *testing.T) {
	r, _ := setup(t)
	mkdir(t, filepath.Join(r.Path(), "pods/uid/volumes"))
	calls := 0
	whileOpen = func() {
		calls++
		if syscall.ForkLock.TryLock() {
			syscall.ForkLock.Unlock()
			t.Error("a descriptor is open while a fork could start")
		}
	}
	defer func() { whileOpen = func() {} }()
	for name, op := range map[string]func(string) error{
		"Verify": func(n string) error { _, err := r.Verify(n); return err },
		"Lstat":  func(n string) error { _, err := r.Lstat(n); return err },
		"Stat":   func(n string) error { _, err := r.Stat(n); return err },
	} {
		before := calls
		if err := op("pods/uid/volumes"); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if calls != before+1 {
			t.Errorf("%s opened %d descriptors through openBriefly, want 1", name, calls-before)
		}
	}
}
