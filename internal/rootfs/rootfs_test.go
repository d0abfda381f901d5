package rootfs

import (
	"errors"
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

	"github.com/nodevol/nodevol/step"
)

// both runs f with openat2 (when the kernel has it) and with the
// component-by-component walk that older kernels get.
func both(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	t.Run("openat2", func(t *testing.T) {
		if !HaveOpenat2() {
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
	// The child is not root on purpose: its root-only tests skip there, even
	// under CI, which runs them in this (root) process.
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "CI=") || strings.HasPrefix(kv, "NODEVOL_REQUIRE_ROOT=")
	})
	cmd.Env = append(env, "ROOTFS_TEST_CHILD=1", "TMPDIR="+tmp)
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
