package rootfs

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSubRefusesSymlinks runs the operations a Root from Sub adds, and
// Sub itself, through a symlink below the root: each is refused, nothing
// outside changes; and a Sub's one-component names are its directory's
// (resolved from the held handle, which it does not close).
func TestSubRefusesSymlinks(t *testing.T) {
	both(t, func(t *testing.T) {
		r, outside := setup(t)
		mkdir(t, filepath.Join(r.Path(), "pods/uid/vol"))
		symlink(t, outside, filepath.Join(r.Path(), "pods/linked"))
		symlink(t, outside, filepath.Join(r.Path(), "pods/uid/vol/link"))
		linked := filepath.Join(r.Path(), "pods/linked")
		if _, err := r.Sub("pods/linked"); !errors.Is(err, ErrSymlink) {
			t.Errorf("Sub through a symlink: %v, want ErrSymlink", err)
		}
		sub, err := r.Sub("pods/uid/vol")
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Close()
		link := filepath.Join(r.Path(), "pods/uid/vol/link")
		for name, op := range map[string]func() (string, error){
			"Mkdir below":        func() (string, error) { return link, sub.Mkdir("link/d", 0o755) },
			"WriteFileNew below": func() (string, error) { return link, sub.WriteFileNew("link/f", []byte("x"), 0o600, -1, -1) },
			"SetMode":            func() (string, error) { return link, sub.SetMode("link", 0o777, -1, -1) },
			"Lchown below":       func() (string, error) { return link, sub.Lchown("link/f", -1, -1) },
			"Rename below":       func() (string, error) { return link, sub.Rename("link/a", "b") },
			"OpenDirFd":          func() (string, error) { _, err := r.OpenDirFd("pods/linked"); return linked, err },
		} {
			t.Run(name, func(t *testing.T) { at, err := op(); assertSymlinkErr(t, err, at) })
		}
		// One component: the link itself is there, never written through.
		if err := sub.WriteFileNew("link", []byte("x"), 0o600, -1, -1); !errors.Is(err, fs.ErrExist) {
			t.Errorf("WriteFileNew over a symlink: %v, want ErrExist", err)
		}
		if err := sub.Mkdir("link", 0o755); !errors.Is(err, fs.ErrExist) {
			t.Errorf("Mkdir over a symlink: %v, want ErrExist", err)
		}
		assertTree(t, outside)
		// And what is not through a symlink works, relative to the Sub.
		if err := sub.Mkdir("d", 0o700); err != nil {
			t.Fatal(err)
		}
		if err := sub.WriteFileNew("d/f", []byte("data"), 0o640, -1, -1); err != nil {
			t.Fatal(err)
		}
		if err := sub.SetMode("d", 0o755, -1, -1); err != nil {
			t.Fatal(err)
		}
		if err := sub.Rename("d/f", "g"); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(filepath.Join(r.Path(), "pods/uid/vol/g"))
		if err != nil || fi.Mode().Perm() != 0o640 {
			t.Errorf("g: %v %v, want mode 0640", fi, err)
		}
		if fi, err := os.Stat(filepath.Join(r.Path(), "pods/uid/vol/d")); err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("d: %v %v, want mode 0755", fi, err)
		}
		// The held handle stays open after one-component calls.
		if err := sub.Mkdir("e", 0o755); err != nil {
			t.Fatal(err)
		}
	})
}

// TestMkdirAllSub: the directory made below the known part and held; made
// says whether this call made it; a symlink anywhere is refused and
// nothing is made through it.
func TestMkdirAllSub(t *testing.T) {
	both(t, func(t *testing.T) {
		r, outside := setup(t)
		mkdir(t, filepath.Join(r.Path(), "pods"))
		name := "pods/uid/volumes/kubernetes.io~csi/pv"
		sub, made, err := r.MkdirAllSub(name, 0o750, 1)
		if err != nil || !made {
			t.Fatalf("MkdirAllSub = %v, %v; want made", made, err)
		}
		if err := sub.WriteFileNew("f", []byte("x"), 0o600, -1, -1); err != nil {
			t.Fatal(err)
		}
		sub.Close()
		if _, err := os.Stat(filepath.Join(r.Path(), name, "f")); err != nil {
			t.Errorf("not written in the held directory: %v", err)
		}
		sub, made, err = r.MkdirAllSub(name, 0o750, 1)
		if err != nil || made {
			t.Fatalf("MkdirAllSub again = %v, %v; want found, not made", made, err)
		}
		sub.Close()
		// The known part missing: made as MkdirAll does, not reported made.
		sub, made, err = r.MkdirAllSub("plugins/kubernetes.io/csi/d/h", 0o750, 4)
		if err != nil || made {
			t.Fatalf("MkdirAllSub without the known part = %v, %v", made, err)
		}
		sub.Close()
		for _, link := range []string{"pods/l1", "pods/l2/volumes", "pods/l3/volumes/kubernetes.io~csi", "pods/l4/volumes/kubernetes.io~csi/pv"} {
			symlink(t, outside, filepath.Join(r.Path(), link))
			_, _, err := r.MkdirAllSub(strings.Replace(name, "uid", strings.Split(link, "/")[1], 1), 0o750, 1)
			assertSymlinkErr(t, err, filepath.Join(r.Path(), link))
		}
		symlink(t, outside, filepath.Join(r.Path(), "linked"))
		_, _, err = r.MkdirAllSub("linked/uid/v", 0o750, 1)
		assertSymlinkErr(t, err, filepath.Join(r.Path(), "linked"))
		assertTree(t, outside)
	})
}
