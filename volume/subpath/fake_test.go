package subpath

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nodevol/nodevol/step"
	"github.com/nodevol/nodevol/volume/subpath/subpathtest"
)

var _ BindRecorder = (*subpathtest.Mounter)(nil)

type fakeEnv struct {
	m    *Manager
	fake *subpathtest.Mounter
	// unmounts are the unmounts made: "plain", or "lazy" by detach.
	unmounts []string
	// detaching is set while the manager detaches a stale mount.
	detaching bool
	root      string
	vol       string
	steps     []step.Step
	// refuse, when set, refuses the steps it returns true for.
	refuse func(step.Step) bool
}

func newFakeEnv(t *testing.T) *fakeEnv {
	t.Helper()
	e := &fakeEnv{root: t.TempDir(), vol: t.TempDir()}
	e.fake = subpathtest.NewMounter(nil)
	e.fake.UnmountFunc = func(string) error {
		how := "plain"
		if e.detaching {
			how = "lazy"
		}
		e.unmounts = append(e.unmounts, how)
		return nil
	}
	m, err := New(Config{RootDir: e.root, Mounter: e.fake, Steps: func(s step.Step) error {
		e.steps = append(e.steps, s)
		if e.refuse != nil && e.refuse(s) {
			return errors.New("refused")
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	detach := m.detach
	m.detach = func(target string) error {
		e.detaching = true
		defer func() { e.detaching = false }()
		return detach(target)
	}
	e.m = m
	return e
}

func (e *fakeEnv) mount(container string, index int, subPath string) Mount {
	return Mount{Pod: "pod-1", Volume: "data", VolumePath: e.vol, Container: container, Index: index, SubPath: subPath}
}

func (e *fakeEnv) target(container string, index int) string {
	return filepath.Join(e.root, "pods/pod-1/volume-subpaths/data", container, fmt.Sprint(index))
}

func (e *fakeEnv) mounts() []string {
	var out []string
	for _, mp := range e.fake.MountPoints {
		out = append(out, mp.Path)
	}
	slices.Sort(out)
	return out
}

func mkdirs(t *testing.T, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

func TestPrepareFake(t *testing.T) {
	ctx := context.Background()
	e := newFakeEnv(t)
	mkdirs(t, filepath.Join(e.vol, "dir/sub"))
	if err := os.WriteFile(filepath.Join(e.vol, "dir/file"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		container string
		index     int
		subPath   string
		dir       bool
	}{
		{"app", 0, "dir/sub", true},
		{"app", 1, "dir/file", false},
		{"side", 0, "dir/sub/", true},
		{"side", 3, ".", true},
	} {
		got, err := e.m.Prepare(ctx, e.mount(tc.container, tc.index, tc.subPath))
		if err != nil {
			t.Fatalf("Prepare %s: %v", tc.subPath, err)
		}
		want := e.target(tc.container, tc.index)
		if got != want {
			t.Fatalf("Prepare %s = %s, want %s", tc.subPath, got, want)
		}
		fi, err := os.Lstat(got)
		if err != nil {
			t.Fatal(err)
		}
		if wantMode := fs.FileMode(fileMode); tc.dir {
			if fi.Mode() != fs.ModeDir|dirMode {
				t.Errorf("%s: mode %v, want a directory of mode 0750", got, fi.Mode())
			}
		} else if fi.Mode() != wantMode || fi.Size() != 0 {
			t.Errorf("%s: mode %v size %d, want an empty file of mode 0640", got, fi.Mode(), fi.Size())
		}
		bound, _ := e.fake.Bound(got)
		if bound.File != filepath.Join(e.vol, tc.subPath) {
			t.Errorf("%s is a bind mount of %q, want %q", got, bound.File, filepath.Join(e.vol, tc.subPath))
		}
		if !slices.Equal(bound.Flags, []string{"--no-canonicalize"}) {
			t.Errorf("mount flags %q, want --no-canonicalize", bound.Flags)
		}
	}
	for _, mp := range e.fake.MountPoints {
		if !slices.Equal(mp.Opts, []string{"bind"}) || !strings.HasPrefix(mp.Device, fmt.Sprintf("/proc/%d/fd/", os.Getpid())) {
			t.Errorf("mount %+v: want a bind mount of /proc/%d/fd/N", mp, os.Getpid())
		}
	}

	// Idempotent: the same mounts again make nothing new.
	before := len(e.fake.GetLog())
	e.steps = nil
	if _, err := e.m.Prepare(ctx, e.mount("app", 0, "dir/sub")); err != nil {
		t.Fatal(err)
	}
	if n := len(e.fake.GetLog()); n != before || len(e.steps) != 0 {
		t.Errorf("a second Prepare took steps %v and %d mounter actions", e.steps, n-before)
	}
}

func TestPrepareCreatesMissingSubPath(t *testing.T) {
	e := newFakeEnv(t)
	if err := os.Chmod(e.vol, fs.ModeSetgid|0o775); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Prepare(context.Background(), e.mount("app", 0, "new/deeper")); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"new", "new/deeper"} {
		fi, err := os.Stat(filepath.Join(e.vol, d))
		if err != nil {
			t.Fatal(err)
		}
		if want := fs.ModeDir | fs.ModeSetgid | 0o775; fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v (the volume root's)", d, fi.Mode(), want)
		}
	}
	if !slices.Contains(e.steps, step.Step{Op: step.Mkdir, Path: filepath.Join(e.vol, "new/deeper")}) {
		t.Errorf("steps %v: the subPath's mkdir was not shown to the hook", e.steps)
	}
}

func TestPrepareReplacesStaleMount(t *testing.T) {
	e := newFakeEnv(t)
	mkdirs(t, filepath.Join(e.vol, "a"), filepath.Join(e.vol, "b"))
	target, err := e.m.Prepare(context.Background(), e.mount("app", 0, "a"))
	if err != nil {
		t.Fatal(err)
	}
	// The same target, now for another directory (the volume was mounted
	// anew, and the mount left there is of the old one).
	e.steps = nil
	if _, err := e.m.Prepare(context.Background(), e.mount("app", 0, "b")); err != nil {
		t.Fatal(err)
	}
	if b, _ := e.fake.Bound(target); !slices.Equal(e.mounts(), []string{target}) || b.File != filepath.Join(e.vol, "b") {
		t.Errorf("mounts %v, %s bound to %q; want one mount of b", e.mounts(), target, b.File)
	}
	// Detached, as the kubelet does it, and announced as an unmount.
	if !slices.Equal(e.unmounts, []string{"lazy"}) {
		t.Errorf("unmounts %q, want one lazy unmount", e.unmounts)
	}
	if len(e.steps) == 0 || e.steps[0] != (step.Step{Op: step.Unmount, Path: target}) {
		t.Errorf("steps %v, want the unmount of %s first", e.steps, target)
	}
}

func TestPrepareMismatchUndone(t *testing.T) {
	e := newFakeEnv(t)
	mkdirs(t, filepath.Join(e.vol, "a"))
	// Another file at the target after the mount than before it.
	n := uint64(0)
	e.m.fileAt = func(string) (fileID, error) {
		n++
		return fileID{dev: 1, ino: n}, nil
	}
	_, err := e.m.Prepare(context.Background(), e.mount("app", 0, "a"))
	if !errors.Is(err, errMismatch) {
		t.Fatalf("Prepare = %v, want errMismatch", err)
	}
	if len(e.fake.MountPoints) != 0 {
		t.Errorf("mounts left: %v", e.fake.MountPoints)
	}
	if _, err := os.Lstat(filepath.Join(e.root, "pods/pod-1/volume-subpaths")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("volume-subpaths left: %v", err)
	}
}

func TestPrepareStepsAndRefusedMount(t *testing.T) {
	e := newFakeEnv(t)
	mkdirs(t, filepath.Join(e.vol, "a"))
	e.refuse = func(s step.Step) bool { return s.Op == step.Mount }
	if _, err := e.m.Prepare(context.Background(), e.mount("app", 0, "a")); err == nil {
		t.Fatal("Prepare succeeded with its mount refused")
	}
	base := filepath.Join(e.root, "pods/pod-1/volume-subpaths")
	want := []step.Step{
		{Op: step.Mkdir, Path: filepath.Join(e.root, "pods")},
		{Op: step.Mkdir, Path: filepath.Join(e.root, "pods/pod-1")},
		{Op: step.Mkdir, Path: base},
		{Op: step.Mkdir, Path: base + "/data"},
		{Op: step.Mkdir, Path: base + "/data/app"},
		{Op: step.Mkdir, Path: base + "/data/app/0"},
		{Op: step.Mount, Path: base + "/data/app/0"},
		{Op: step.Remove, Path: base + "/data/app/0"},
		{Op: step.Remove, Path: base + "/data/app"},
		{Op: step.Remove, Path: base + "/data"},
		{Op: step.Remove, Path: base},
	}
	if !slices.Equal(e.steps, want) {
		t.Errorf("steps:\n%v\nwant:\n%v", e.steps, want)
	}
}
