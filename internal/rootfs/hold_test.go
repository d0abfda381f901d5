package rootfs

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nodevol/nodevol/internal/roottest"
)

// hold returns r held, closed at the end of the test.
func hold(t *testing.T, r *Root) *Root {
	t.Helper()
	h, err := r.Hold()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h
}

// TestHoldRefusesSymlinks runs every kind of operation on a held root
// through a symlink below it: each is refused as it is without a hold, and
// nothing outside the root changes.
func TestHoldRefusesSymlinks(t *testing.T) {
	both(t, func(t *testing.T) {
		r, outside := setup(t)
		mkdir(t, filepath.Join(r.Path(), "pods/uid"))
		symlink(t, outside, filepath.Join(r.Path(), "pods/linked"))
		h := hold(t, r)
		linked := filepath.Join(r.Path(), "pods/linked")
		for name, op := range map[string]func() error{
			"MkdirAll":         func() error { return h.MkdirAll("pods/linked/a/b", 0o750) },
			"MkdirAll last":    func() error { return h.MkdirAll("pods/linked", 0o750) },
			"Verify":           func() error { _, err := h.Verify("pods/linked/x"); return err },
			"Stat":             func() error { _, err := h.Stat("pods/linked"); return err },
			"WriteFileInPlace": func() error { return h.WriteFileInPlace("pods/linked/f", []byte("x"), 0o600) },
			"WriteFileAtomic":  func() error { return h.WriteFileAtomic("pods/linked/f", []byte("x"), 0o600) },
			"Remove":           func() error { return h.Remove("pods/linked") },
			"RemoveIn":         func() error { return h.RemoveIn("pods/linked", "f") },
			"Create":           func() error { return h.Create("pods/linked/f", 0o600) },
		} {
			t.Run(name, func(t *testing.T) { assertSymlinkErr(t, op(), linked) })
		}
		assertTree(t, outside)
		// What is not through a symlink works as without a hold.
		if err := h.MkdirAll("pods/uid/volumes/csi/vol", 0o750); err != nil {
			t.Fatal(err)
		}
		if err := h.WriteFileInPlace("pods/uid/volumes/csi/vol/f", []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := h.RemoveIn("pods/uid/volumes/csi/vol", "f"); err != nil {
			t.Fatal(err)
		}
		assertTree(t, filepath.Join(r.Path(), "pods/uid"), "volumes", "volumes/csi")
	})
}

// TestHoldResolvesFromItsHandle: a held root resolves from the directory
// it opened, even once another directory has taken the root's path; a
// fresh hold, and the root itself, see the new one.
func TestHoldResolvesFromItsHandle(t *testing.T) {
	r, _ := setup(t)
	writeFile(t, filepath.Join(r.Path(), "old"), "x")
	h := hold(t, r)
	if err := os.Rename(r.Path(), r.Path()+".moved"); err != nil {
		t.Fatal(err)
	}
	mkdir(t, r.Path())
	if _, err := h.Stat("old"); err != nil {
		t.Errorf("held root: %v, want the file of the directory it held", err)
	}
	if err := h.MkdirAll("made/below", 0o750); err != nil {
		t.Fatal(err)
	}
	assertTree(t, r.Path()+".moved", "made", "made/below", "old")
	assertTree(t, r.Path())
	if _, err := hold(t, r).Stat("old"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("fresh hold: %v, want the new, empty directory", err)
	}
	if _, err := r.Stat("old"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("unheld root: %v, want the new, empty directory", err)
	}
}

// TestHoldSeesLaterMount: a file system mounted on the root after a hold
// is seen by a fresh hold (and not through the earlier one).
func TestHoldSeesLaterMount(t *testing.T) {
	roottest.Require(t)
	r, _ := setup(t)
	writeFile(t, filepath.Join(r.Path(), "under"), "x")
	early := hold(t, r)
	if err := unix.Mount("tmpfs", r.Path(), "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(r.Path(), unix.MNT_DETACH) })
	writeFile(t, filepath.Join(r.Path(), "over"), "x")
	fresh := hold(t, r)
	if _, err := fresh.Stat("over"); err != nil {
		t.Errorf("fresh hold: %v, want the mounted file system's file", err)
	}
	if _, err := fresh.Stat("under"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("fresh hold sees the covered file: %v", err)
	}
	if _, err := early.Stat("under"); err != nil {
		t.Errorf("earlier hold: %v, want the directory it held", err)
	}
}

// TestHoldClose: Close releases the handle once, and is a no-op on a Root
// from New.
func TestHoldClose(t *testing.T) {
	r, _ := setup(t)
	mkdir(t, r.Path())
	h, err := r.Hold()
	if err != nil {
		t.Fatal(err)
	}
	fd := h.fd
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
		t.Errorf("the held descriptor is still open after Close (%v)", err)
	}
	if err := h.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Errorf("Close of an unheld root: %v", err)
	}
	if _, err := New(filepath.Join(r.Path(), "missing")); err != nil {
		t.Fatal(err)
	}
	if _, err := (&Root{path: filepath.Join(r.Path(), "missing")}).Hold(); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Hold of a missing root: %v, want ErrNotExist", err)
	}
}

// TestHoldIfPresent: a root that exists is held until the release; one
// that does not is given back itself, unheld, and its calls make it.
func TestHoldIfPresent(t *testing.T) {
	r, _ := setup(t)
	mkdir(t, r.Path())
	h, release, err := r.HoldIfPresent()
	if err != nil {
		t.Fatal(err)
	}
	if !h.held || h == r {
		t.Fatalf("HoldIfPresent of an existing root: held=%v, same Root=%v; want a held copy", h.held, h == r)
	}
	fd := h.fd
	release()
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
		t.Errorf("the held descriptor is still open after the release (%v)", err)
	}

	missing, err := New(filepath.Join(r.Path(), "later"))
	if err != nil {
		t.Fatal(err)
	}
	m, release, err := missing.HoldIfPresent()
	if err != nil {
		t.Fatalf("HoldIfPresent of a missing root: %v", err)
	}
	defer release()
	if m != missing {
		t.Fatal("HoldIfPresent of a missing root did not give the root back itself")
	}
	if err := m.MkdirAll("a/b", 0o750); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(missing.Path(), "a", "b")); err != nil {
		t.Errorf("MkdirAll through the unheld root: %v", err)
	}
}

// TestMkdirAllMakesWhatIsMissing: from a held root and not, MkdirAll
// makes the missing components under the deepest existing one, accepts a
// path that is all there, and refuses a file on the way.
func TestMkdirAllMakesWhatIsMissing(t *testing.T) {
	both(t, func(t *testing.T) {
		for _, held := range []bool{false, true} {
			r, outside := setup(t)
			mkdir(t, filepath.Join(r.Path(), "plugins/csi"))
			rr := r
			if held {
				rr = hold(t, r)
			}
			for _, name := range []string{"plugins/csi/drv/h/globalmount", "plugins/csi/drv/h2/globalmount", "plugins/csi/drv/h2/globalmount", "pods/u/v"} {
				if err := rr.MkdirAll(name, 0o750); err != nil {
					t.Fatalf("held %v: MkdirAll(%s): %v", held, name, err)
				}
			}
			assertTree(t, r.Path(), "plugins", "plugins/csi", "plugins/csi/drv", "plugins/csi/drv/h", "plugins/csi/drv/h/globalmount",
				"plugins/csi/drv/h2", "plugins/csi/drv/h2/globalmount", "pods", "pods/u", "pods/u/v")
			writeFile(t, filepath.Join(r.Path(), "plugins/csi/drv/file"), "x")
			if err := rr.MkdirAll("plugins/csi/drv/file/x", 0o750); !errors.Is(err, ErrNotDir) {
				t.Errorf("held %v: MkdirAll through a file = %v, want ErrNotDir", held, err)
			}
			assertTree(t, outside)
		}
	})
}
