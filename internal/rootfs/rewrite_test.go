package rootfs

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/nodevol/nodevol/step"
)

// TestOpenRewrite: a file opened once and written again on its
// descriptor; a longer content left is padded, not cut; no symlink is
// followed (the name's own, or one above it) and nothing but a regular
// file is written.
func TestOpenRewrite(t *testing.T) {
	both(t, func(t *testing.T) {
		r, outside := setup(t)
		mkdir(t, filepath.Join(r.Path(), "nodevol/records/ab"))
		name := "nodevol/records/ab/rec.json"
		full := filepath.Join(r.Path(), name)
		f, err := r.OpenRewrite(name, []byte(`{"phase":"Staging"}`), 0o600, true, ' ')
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Rewrite([]byte(`{"phase":"Staged"}`)); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		// Without the padding the old content's last byte would be left.
		if got, _ := os.ReadFile(full); string(got) != `{"phase":"Staged"} ` {
			t.Errorf("after a shorter rewrite the file holds %q, want the new content padded", got)
		}
		if fi, err := os.Stat(full); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("mode %v, %v; want 0600", fi.Mode(), err)
		}
		// There already (fresh or not): opened, checked, padded to its length.
		for _, fresh := range []bool{true, false} {
			f, err := r.OpenRewrite(name, []byte(`{}`), 0o600, fresh, ' ')
			if err != nil {
				t.Fatal(err)
			}
			f.Close()
			if got, _ := os.ReadFile(full); string(got) != "{}"+strings.Repeat(" ", 17) {
				t.Errorf("fresh=%v over an existing file: %q", fresh, got)
			}
		}
		// A symlink as the name or above it: refused, nothing written.
		symlink(t, filepath.Join(outside, "target"), filepath.Join(r.Path(), "nodevol/records/ab/link.json"))
		symlink(t, outside, filepath.Join(r.Path(), "nodevol/records/cd"))
		for _, fresh := range []bool{true, false} {
			_, err := r.OpenRewrite("nodevol/records/ab/link.json", []byte("x"), 0o600, fresh, ' ')
			assertSymlinkErr(t, err, filepath.Join(r.Path(), "nodevol/records/ab/link.json"))
			_, err = r.OpenRewrite("nodevol/records/cd/rec.json", []byte("x"), 0o600, fresh, ' ')
			assertSymlinkErr(t, err, filepath.Join(r.Path(), "nodevol/records/cd"))
		}
		assertTree(t, outside)
		// A FIFO: refused without blocking, nothing written.
		fifo := filepath.Join(r.Path(), "nodevol/records/ab/fifo.json")
		if err := syscall.Mkfifo(fifo, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := r.OpenRewrite("nodevol/records/ab/fifo.json", []byte("x"), 0o600, false, ' '); err == nil {
			t.Error("OpenRewrite of a FIFO succeeded")
		}
		// A directory.
		mkdir(t, filepath.Join(r.Path(), "nodevol/records/ab/dir.json"))
		if _, err := r.OpenRewrite("nodevol/records/ab/dir.json", []byte("x"), 0o600, false, ' '); err == nil {
			t.Error("OpenRewrite of a directory succeeded")
		}
		// Missing directory: not made.
		if _, err := r.OpenRewrite("nodevol/records/ef/rec.json", []byte("x"), 0o600, true, ' '); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("OpenRewrite in a missing directory: %v, want ErrNotExist", err)
		}
	})
}

// TestOpenRewriteSteps: each write is shown to the hook first, and a
// refused one writes nothing.
func TestOpenRewriteSteps(t *testing.T) {
	r, _ := setup(t)
	mkdir(t, r.Path())
	var steps []string
	refuse := false
	h := r.WithSteps(func(s step.Step) error {
		steps = append(steps, string(s.Op)+" "+s.Path)
		if refuse {
			return errors.New("refused")
		}
		return nil
	})
	f, err := h.OpenRewrite("rec", []byte("one"), 0o600, true, ' ')
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	refuse = true
	if err := f.Rewrite([]byte("two")); err == nil {
		t.Error("a refused rewrite succeeded")
	}
	full := filepath.Join(r.Path(), "rec")
	if got, _ := os.ReadFile(full); string(got) != "one" {
		t.Errorf("after a refused rewrite the file holds %q", got)
	}
	if want := []string{"write " + full, "write " + full}; strings.Join(steps, ",") != strings.Join(want, ",") {
		t.Errorf("steps %q, want %q", steps, want)
	}
	if _, err := h.OpenRewrite("new", []byte("x"), 0o600, true, ' '); err == nil {
		t.Error("a refused OpenRewrite succeeded")
	}
	if _, err := os.Lstat(filepath.Join(r.Path(), "new")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused OpenRewrite created the file: %v", err)
	}
}
