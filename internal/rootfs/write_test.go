package rootfs

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestMkdirAll(t *testing.T) {
	both(t, func(t *testing.T) {
		r, outside := setup(t)
		// The root is created too.
		if err := r.MkdirAll("pods/uid/volumes", 0o750); err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Lstat(filepath.Join(r.Path(), "pods/uid/volumes")); err != nil || !fi.IsDir() {
			t.Fatalf("not created: %v", err)
		}
		if err := r.MkdirAll(filepath.Join(r.Path(), "pods/uid/volumes"), 0o750); err != nil {
			t.Errorf("again, by absolute path: %v", err)
		}
		if err := r.MkdirAll(".", 0o750); err != nil {
			t.Errorf("MkdirAll(.): %v", err)
		}

		// A symlink as a component, anywhere below the root.
		symlink(t, outside, filepath.Join(r.Path(), "pods/linked"))
		err := r.MkdirAll("pods/linked/volumes/x", 0o750)
		assertSymlinkErr(t, err, filepath.Join(r.Path(), "pods/linked"))
		err = r.MkdirAll("pods/linked", 0o750)
		assertSymlinkErr(t, err, filepath.Join(r.Path(), "pods/linked"))
		// A relative symlink, and one that stays inside the root: refused too.
		symlink(t, "uid", filepath.Join(r.Path(), "pods/rel"))
		assertSymlinkErr(t, r.MkdirAll("pods/rel/volumes", 0o750), filepath.Join(r.Path(), "pods/rel"))
		symlink(t, "../../outside", filepath.Join(r.Path(), "pods/up"))
		assertSymlinkErr(t, r.MkdirAll("pods/up/x", 0o750), filepath.Join(r.Path(), "pods/up"))

		// A file where a directory must be.
		writeFile(t, filepath.Join(r.Path(), "pods/file"), "x")
		err = r.MkdirAll("pods/file/x", 0o750)
		if !errors.Is(err, ErrNotDir) || !strings.Contains(err.Error(), "pods/file is not a directory") {
			t.Errorf("MkdirAll through a file = %v, want ErrNotDir naming it", err)
		}
		assertTree(t, outside)
	})
}

func TestWriteFileAtomic(t *testing.T) {
	both(t, func(t *testing.T) {
		r, outside := setup(t)
		writeFile(t, filepath.Join(outside, "secret"), "secret")
		mkdir(t, filepath.Join(r.Path(), "a"))
		if err := r.WriteFileAtomic("a/vol_data.json", []byte("one"), 0o640); err != nil {
			t.Fatal(err)
		}
		if err := r.WriteFileAtomic("a/vol_data.json", []byte("two"), 0o640); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(r.Path(), "a/vol_data.json")
		if data, err := os.ReadFile(path); err != nil || string(data) != "two" {
			t.Errorf("content %q, %v", data, err)
		}
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o640 {
			t.Errorf("mode %v, %v; want 0640", fi.Mode(), err)
		}
		assertTree(t, filepath.Join(r.Path(), "a"), "vol_data.json") // no temporary file left

		// A symlink as the file is replaced, not written through.
		symlink(t, filepath.Join(outside, "secret"), filepath.Join(r.Path(), "b/vol_data.json"))
		if err := r.WriteFileAtomic("b/vol_data.json", []byte("mine"), 0o640); err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Lstat(filepath.Join(r.Path(), "b/vol_data.json")); err != nil || !fi.Mode().IsRegular() {
			t.Errorf("the symlink was not replaced by a file: %v, %v", fi, err)
		}
		// A symlink as the directory: refused, nothing written.
		symlink(t, outside, filepath.Join(r.Path(), "c"))
		err := r.WriteFileAtomic("c/vol_data.json", []byte("mine"), 0o640)
		assertSymlinkErr(t, err, filepath.Join(r.Path(), "c"))
		if data, _ := os.ReadFile(filepath.Join(outside, "secret")); string(data) != "secret" {
			t.Errorf("the outside file was written: %q", data)
		}
		assertTree(t, outside, "secret")
		if err := r.WriteFileAtomic("missing/x", nil, 0o640); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("WriteFileAtomic in a missing directory = %v, want ErrNotExist", err)
		}
	})
}

func TestWriteFileInPlace(t *testing.T) {
	both(t, func(t *testing.T) {
		r, outside := setup(t)
		writeFile(t, filepath.Join(outside, "secret"), "secret")
		mkdir(t, filepath.Join(r.Path(), "a"))
		if err := r.WriteFileInPlace("a/rec.json", []byte("a longer content"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := r.WriteFileInPlace("a/rec.json", []byte("short"), 0o600); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(r.Path(), "a/rec.json")
		if data, err := os.ReadFile(path); err != nil || string(data) != "short" {
			t.Errorf("content %q, %v; want the old tail cut", data, err)
		}
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("mode %v, %v; want 0600", fi.Mode(), err)
		}
		// A symlink as the file or the directory: refused, nothing written
		// through it.
		symlink(t, filepath.Join(outside, "secret"), filepath.Join(r.Path(), "b/rec.json"))
		if err := r.WriteFileInPlace("b/rec.json", []byte("mine"), 0o600); !errors.Is(err, ErrSymlink) {
			t.Errorf("through a symlinked file: %v, want ErrSymlink", err)
		}
		symlink(t, outside, filepath.Join(r.Path(), "c"))
		if err := r.WriteFileInPlace("c/secret", []byte("mine"), 0o600); !errors.Is(err, ErrSymlink) {
			t.Errorf("through a symlinked directory: %v, want ErrSymlink", err)
		}
		if data, _ := os.ReadFile(filepath.Join(outside, "secret")); string(data) != "secret" {
			t.Errorf("outside file now %q", data)
		}
		// Not a regular file: refused.
		mkdir(t, filepath.Join(r.Path(), "d/rec.json"))
		if err := r.WriteFileInPlace("d/rec.json", []byte("x"), 0o600); err == nil {
			t.Error("writing over a directory succeeded")
		}
	})
}

func TestCreateAndLinks(t *testing.T) {
	both(t, func(t *testing.T) {
		r, outside := setup(t)
		mkdir(t, filepath.Join(r.Path(), "dev"))
		if err := r.Create("dev/uid", 0o640); err != nil {
			t.Fatal(err)
		}
		if err := r.Create("dev/uid", 0o640); !errors.Is(err, fs.ErrExist) {
			t.Errorf("Create again = %v, want ErrExist", err)
		}
		symlink(t, filepath.Join(outside, "new"), filepath.Join(r.Path(), "dev/dangling"))
		if err := r.Create("dev/dangling", 0o640); !errors.Is(err, fs.ErrExist) {
			t.Errorf("Create over a dangling symlink = %v, want ErrExist", err)
		}
		symlink(t, outside, filepath.Join(r.Path(), "linked"))
		assertSymlinkErr(t, r.Create("linked/uid", 0o640), filepath.Join(r.Path(), "linked"))

		if err := r.Symlink("/some/target", "dev/link"); err != nil {
			t.Fatal(err)
		}
		if got, err := r.Readlink("dev/link"); err != nil || got != "/some/target" {
			t.Errorf("Readlink = %q, %v", got, err)
		}
		if _, err := r.Readlink("dev/uid"); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("Readlink(a file) = %v, want EINVAL", err)
		}
		assertSymlinkErr(t, r.Symlink("/x", "linked/link"), filepath.Join(r.Path(), "linked"))
		if err := r.RemoveLink("dev/uid"); err == nil {
			t.Error("RemoveLink removed a file")
		}
		if err := r.RemoveLink("dev/link"); err != nil {
			t.Error(err)
		}
		if err := r.RemoveLink("dev/link"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("RemoveLink again = %v, want ErrNotExist", err)
		}
		assertSymlinkErr(t, r.RemoveLink("linked/x"), filepath.Join(r.Path(), "linked"))
		assertTree(t, outside)
	})
}
