package rootfs

import (
	"errors"
	"io/fs"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func TestRemove(t *testing.T) {
	both(t, func(t *testing.T) {
		r, outside := setup(t)
		writeFile(t, filepath.Join(outside, "vol_data.json"), "{}")
		mkdir(t, filepath.Join(outside, "mount"))
		writeFile(t, filepath.Join(r.Path(), "v/vol_data.json"), "{}")
		mkdir(t, filepath.Join(r.Path(), "v/mount"))
		writeFile(t, filepath.Join(r.Path(), "full/x"), "")
		symlink(t, outside, filepath.Join(r.Path(), "linked"))
		symlink(t, filepath.Join(outside, "mount"), filepath.Join(r.Path(), "v/link"))

		for _, name := range []string{"v/mount", "v/vol_data.json"} {
			if err := r.Remove(name); err != nil {
				t.Errorf("Remove(%s): %v", name, err)
			}
		}
		if err := r.Remove("full"); !errors.Is(err, syscall.ENOTEMPTY) {
			t.Errorf("Remove(a non-empty directory) = %v, want ENOTEMPTY", err)
		}
		if err := r.Remove("v/missing"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Remove(missing) = %v, want ErrNotExist", err)
		}
		if err := r.Remove("missing/x"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Remove(missing/x) = %v, want ErrNotExist", err)
		}
		for _, name := range []string{"linked/vol_data.json", "linked/mount", "linked"} {
			assertSymlinkErr(t, r.Remove(name), filepath.Join(r.Path(), "linked"))
		}
		assertSymlinkErr(t, r.Remove("v/link"), filepath.Join(r.Path(), "v/link"))
		if err := unix.Mkfifo(filepath.Join(r.Path(), "v/fifo"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := r.Remove("v/fifo"); !errors.Is(err, ErrNotRemovable) {
			t.Errorf("Remove(a FIFO) = %v, want ErrNotRemovable", err)
		}
		if err := r.Remove("."); err == nil {
			t.Error("Remove(.) succeeded")
		}
		assertTree(t, outside, "mount", "vol_data.json")
		assertTree(t, filepath.Join(r.Path(), "v"), "fifo", "link")
	})
}

// TestRemoveAny removes what is at a name, whatever it is, without
// following it: a symlink goes, what it points to stays.
// (Unlink, which does not look first, removes what RemoveAny does.)
func TestRemoveAny(t *testing.T) {
	for name, removeAny := range map[string]func(*Root, string) error{"RemoveAny": (*Root).RemoveAny, "Unlink": (*Root).Unlink} {
		t.Run(name, func(t *testing.T) { testRemoveAny(t, removeAny) })
	}
}

func testRemoveAny(t *testing.T, removeAny func(*Root, string) error) {
	both(t, func(t *testing.T) {
		r, outside := setup(t)
		writeFile(t, filepath.Join(outside, "target"), "x")
		writeFile(t, filepath.Join(r.Path(), "v/file"), "{}")
		mkdir(t, filepath.Join(r.Path(), "v/empty"))
		writeFile(t, filepath.Join(r.Path(), "v/full/x"), "")
		symlink(t, filepath.Join(outside, "target"), filepath.Join(r.Path(), "v/link"))
		symlink(t, outside, filepath.Join(r.Path(), "linked"))
		if err := unix.Mkfifo(filepath.Join(r.Path(), "v/fifo"), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"v/file", "v/empty", "v/link", "v/fifo"} {
			if err := removeAny(r, name); err != nil {
				t.Errorf("RemoveAny(%s): %v", name, err)
			}
		}
		if err := removeAny(r, "v/full"); !errors.Is(err, syscall.ENOTEMPTY) {
			t.Errorf("RemoveAny(a non-empty directory) = %v, want ENOTEMPTY", err)
		}
		if err := removeAny(r, "v/missing"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("RemoveAny(missing) = %v, want ErrNotExist", err)
		}
		assertSymlinkErr(t, removeAny(r, "linked/target"), filepath.Join(r.Path(), "linked"))
		assertTree(t, outside, "target")
		assertTree(t, filepath.Join(r.Path(), "v"), "full", "full/x")
	})
}

// TestRemoveIn removes a volume directory's entries and the directory
// through one handle, and refuses what Remove refuses.
func TestRemoveIn(t *testing.T) {
	both(t, func(t *testing.T) {
		r, outside := setup(t)
		writeFile(t, filepath.Join(outside, "vol_data.json"), "{}")
		mkdir(t, filepath.Join(outside, "mount"))
		writeFile(t, filepath.Join(r.Path(), "a/v/vol_data.json"), "{}")
		mkdir(t, filepath.Join(r.Path(), "a/v/mount"))
		mkdir(t, filepath.Join(r.Path(), "a/half"))
		writeFile(t, filepath.Join(r.Path(), "a/full/mount/data"), "")
		writeFile(t, filepath.Join(r.Path(), "a/full/vol_data.json"), "{}")
		symlink(t, outside, filepath.Join(r.Path(), "a/linked"))
		mkdir(t, filepath.Join(r.Path(), "a/linkin"))
		symlink(t, filepath.Join(outside, "mount"), filepath.Join(r.Path(), "a/linkin/mount"))
		symlink(t, outside, filepath.Join(r.Path(), "up"))

		if err := r.RemoveIn("a/v", "mount", "vol_data.json"); err != nil {
			t.Errorf("RemoveIn(a/v): %v", err)
		}
		// Missing entries, a missing directory and a missing parent are skipped.
		for _, dir := range []string{"a/half", "a/missing", "missing/x"} {
			if err := r.RemoveIn(dir, "mount", "vol_data.json"); err != nil {
				t.Errorf("RemoveIn(%s): %v", dir, err)
			}
		}
		// What a driver left in the target stays, and so does everything after.
		if err := r.RemoveIn("a/full", "mount", "vol_data.json"); !errors.Is(err, syscall.ENOTEMPTY) {
			t.Errorf("RemoveIn(a/full) = %v, want ENOTEMPTY", err)
		}
		assertSymlinkErr(t, r.RemoveIn("a/linked", "mount", "vol_data.json"), filepath.Join(r.Path(), "a/linked"))
		assertSymlinkErr(t, r.RemoveIn("a/linkin", "mount"), filepath.Join(r.Path(), "a/linkin/mount"))
		assertSymlinkErr(t, r.RemoveIn("up/x", "mount"), filepath.Join(r.Path(), "up"))
		if err := r.RemoveIn("a/linkin", "../linked"); err == nil {
			t.Error("RemoveIn with a name that is not a base name succeeded")
		}
		assertTree(t, outside, "mount", "vol_data.json")
		assertTree(t, filepath.Join(r.Path(), "a"), "full", "full/mount", "full/mount/data", "full/vol_data.json", "linked", "linkin", "linkin/mount")
	})
}
