package rootfs

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nodevol/nodevol/util/step"
)

// both runs f with openat2 (when the kernel has it) and with the
// component-by-component walk that older kernels get.
func both(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	t.Run("openat2", func(t *testing.T) {
		if !haveOpenat2() {
			t.Skip("the kernel has no openat2")
		}
		f(t)
	})
	t.Run("walk", func(t *testing.T) {
		noOpenat2 = true
		t.Cleanup(func() { noOpenat2 = false })
		f(t)
	})
}

// setup returns a root (not created yet: "kubelet" in a temporary
// directory) and an outside directory that must stay empty.
func setup(t *testing.T) (*Root, string) {
	t.Helper()
	base := t.TempDir()
	r, err := New(filepath.Join(base, "kubelet"))
	if err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(base, "outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	return r, outside
}

func mkdir(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(path, 0o755); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	mkdir(t, filepath.Dir(link))
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	mkdir(t, filepath.Dir(path))
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// listTree returns every path under dir, relative to it, sorted.
func listTree(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path != dir {
			rel, _ := filepath.Rel(dir, path)
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func assertTree(t *testing.T, dir string, want ...string) {
	t.Helper()
	if got := listTree(t, dir); !slices.Equal(got, want) {
		t.Errorf("%s holds %q, want %q", dir, got, want)
	}
}

// assertSymlinkErr checks that err says component is a symlink.
func assertSymlinkErr(t *testing.T, err error, component string) {
	t.Helper()
	var pe *PathError
	switch {
	case err == nil:
		t.Fatalf("no error, want %s refused as a symlink", component)
	case !errors.Is(err, ErrSymlink) || !errors.As(err, &pe):
		t.Fatalf("error %v, want a *PathError wrapping ErrSymlink", err)
	case pe.Component != component:
		t.Errorf("error %v names component %q, want %q", err, pe.Component, component)
	case !strings.Contains(err.Error(), component+" is a symlink"):
		t.Errorf("error %q does not say that %s is a symlink", err, component)
	}
}

func TestRel(t *testing.T) {
	r, err := New("/var/lib/kubelet/")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"/var/lib/kubelet":             ".",
		"/var/lib/kubelet/pods/x":      "pods/x",
		"/var/lib/kubelet//pods/./x/":  "pods/x",
		"pods/x":                       "pods/x",
		"pods/x/../y":                  "pods/y",
		".":                            ".",
		"/var/lib/kubelet/a/../pods/x": "pods/x",
	} {
		if got, err := r.Rel(name); err != nil || got != want {
			t.Errorf("Rel(%q) = %q, %v; want %q", name, got, err, want)
		}
	}
	for _, name := range []string{"", "/var/lib/kubelet2/x", "/var/lib", "/var/lib/kubelet/../x", "..", "../kubelet/x", "a/../../x"} {
		if got, err := r.Rel(name); err == nil {
			t.Errorf("Rel(%q) = %q, want an error", name, got)
		} else if name != "" && !errors.Is(err, ErrOutside) {
			t.Errorf("Rel(%q) error %v does not wrap ErrOutside", name, err)
		}
	}
	root, _ := New("/")
	if got, err := root.Rel("/etc/passwd"); err != nil || got != "etc/passwd" {
		t.Errorf("Rel under / = %q, %v", got, err)
	}
}

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
func TestRemoveAny(t *testing.T) {
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
			if err := r.RemoveAny(name); err != nil {
				t.Errorf("RemoveAny(%s): %v", name, err)
			}
		}
		if err := r.RemoveAny("v/full"); !errors.Is(err, syscall.ENOTEMPTY) {
			t.Errorf("RemoveAny(a non-empty directory) = %v, want ENOTEMPTY", err)
		}
		if err := r.RemoveAny("v/missing"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("RemoveAny(missing) = %v, want ErrNotExist", err)
		}
		assertSymlinkErr(t, r.RemoveAny("linked/target"), filepath.Join(r.Path(), "linked"))
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

// TestSwappedComponent swaps a directory under the root for a symlink to
// an outside directory and back, as fast as it can, while MkdirAll,
// WriteFileAtomic and Remove work below it: whatever the interleaving,
// nothing is ever created in, or removed from, the outside directory.
func TestSwappedComponent(t *testing.T) {
	both(t, func(t *testing.T) {
		r, outside := setup(t)
		writeFile(t, filepath.Join(outside, "keep/vol_data.json"), "{}")
		mkdir(t, filepath.Join(r.Path(), "pods"))
		dir, link := filepath.Join(r.Path(), "pods/uid"), filepath.Join(r.Path(), "pods/link")
		if err := os.Symlink(outside, link); err != nil {
			t.Fatal(err)
		}
		mkdir(t, dir)
		var stop atomic.Bool
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			aside := filepath.Join(r.Path(), "pods/aside")
			for !stop.Load() {
				// dir -> aside, link -> dir; then back.
				_ = os.Rename(dir, aside)
				_ = os.Rename(link, dir)
				_ = os.Rename(dir, link)
				_ = os.Rename(aside, dir)
			}
		}()
		for range 400 {
			_ = r.MkdirAll("pods/uid/keep/mount", 0o750)
			_ = r.WriteFileAtomic("pods/uid/keep/vol_data.json", []byte("{}"), 0o640)
			_ = r.Remove("pods/uid/keep/mount")
			_ = r.Remove("pods/uid/keep/vol_data.json")
			_ = r.Remove("pods/uid/keep")
		}
		stop.Store(true)
		wg.Wait()
		assertTree(t, outside, "keep", "keep/vol_data.json")
	})
}

// TestAsNonRoot runs this package's tests again as an unprivileged user
// (nobody) when the suite runs as root: the checks need no privilege, and
// must hold for an agent that runs without it. As non-root the suite
// itself is that run.
func TestAsNonRoot(t *testing.T) {
	if os.Getenv("ROOTFS_TEST_CHILD") != "" {
		t.Skip("already the unprivileged run")
	}
	if os.Geteuid() != 0 {
		t.Skip("not root: this run is the unprivileged one")
	}
	if testing.Short() {
		t.Skip("-short")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// A world-readable copy of the test binary and a home the child owns.
	dir, err := os.MkdirTemp("", "rootfs-nonroot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	bin := filepath.Join(dir, "rootfs.test")
	src, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, src, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	const nobody = 65534
	if err := os.Chown(tmp, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.v", "-test.count=1", "-test.run", "^Test[^A]")
	cmd.Env = append(os.Environ(), "ROOTFS_TEST_CHILD=1", "TMPDIR="+tmp)
	cmd.Dir = tmp
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the tests as uid %d: %v\n%s", nobody, err, out)
	}
	if !strings.Contains(string(out), "--- PASS: TestSwappedComponent") {
		t.Fatalf("the run as uid %d did not run the tests:\n%s", nobody, out)
	}
	t.Logf("as uid %d:\n%s", nobody, out)
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

// TestWithSteps: every change is shown to the hook before it is made, with
// its absolute path; a refused change is not made, and nothing after it is
// undone either (the temporary file of a write refused at its rename stays,
// as after a crash there); reads are not shown.
func TestWithSteps(t *testing.T) {
	dir := t.TempDir()
	plain, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	refuse := "none"
	r := plain.WithSteps(func(s step.Step) error {
		seen = append(seen, string(s.Op)+" "+strings.TrimPrefix(s.Path, dir+"/"))
		if string(s.Op) == refuse {
			refuse = "" // and every step after it, as a crash does
		}
		if refuse == "" {
			return errors.New("refused")
		}
		return nil
	})
	for _, f := range []func() error{
		func() error { return r.MkdirAll("a/b", 0o750) },
		func() error { return r.WriteFileInPlace("a/f", []byte("x"), 0o600) },
		func() error { return r.Symlink("f", "a/l") },
		func() error { return r.Create("a/c", 0o600) },
		func() error { _, err := r.ReadDir("a"); return err },
		func() error { return r.RemoveIn("a/b") },
		func() error { return r.Remove("a/c") },
	} {
		if err := f(); err != nil {
			t.Fatal(err)
		}
	}
	refuse = "rename"
	if err := r.WriteFileAtomic("a/g", []byte("x"), 0o600); err == nil {
		t.Fatal("WriteFileAtomic with its rename refused succeeded")
	}
	want := []string{"mkdir a", "mkdir a/b", "write a/f", "symlink a/l", "create a/c", "remove a/b", "remove a/c"}
	if len(seen) != len(want)+3 || !slices.Equal(seen[:len(want)], want) ||
		!strings.HasPrefix(seen[len(want)], "write a/.g.tmp-") || seen[len(want)+1] != "rename a/g" ||
		!strings.HasPrefix(seen[len(want)+2], "remove a/.g.tmp-") {
		t.Errorf("steps seen %q, want %q, then the temporary file's write, the rename and its clean-up", seen, want)
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "a"))
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if len(names) != 3 || !strings.HasPrefix(names[0], ".g.tmp-") || names[1] != "f" || names[2] != "l" {
		t.Errorf("a holds %v, want the temporary file of the refused write, f and l", names)
	}
	refuse = "mkdir"
	if err := r.MkdirAll("x/y", 0o750); err == nil {
		t.Error("MkdirAll with its mkdir refused succeeded")
	}
	if _, err := os.Lstat(filepath.Join(dir, "x")); !os.IsNotExist(err) {
		t.Errorf("x after a refused mkdir: %v, want missing", err)
	}
}
