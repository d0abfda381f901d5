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

	"golang.org/x/sys/unix"
	"k8s.io/mount-utils"
)

// symlinkVolume lays out, in the volume vol, symlinks of every kind a pod
// can plant, next to a directory outside it (returned) that must stay
// untouched. {VOL} and {OUT} in a target stand for the two paths.
func symlinkVolume(t *testing.T, vol string) string {
	t.Helper()
	outside := t.TempDir()
	mkdirs(t, filepath.Join(vol, "a"), filepath.Join(vol, "v2"), filepath.Join(outside, "secret"))
	write(t, filepath.Join(vol, "a/f"), "f")
	write(t, filepath.Join(vol, "v2/x"), "x")
	write(t, filepath.Join(vol, "file"), "")
	write(t, filepath.Join(outside, "secret/key"), "host")
	for _, l := range [][2]string{
		{"current", "v2"},                                 // relative, inside
		{"abs", "{VOL}/v2"},                               // absolute, inside
		{"absdots", "{VOL}/a/../v2"},                      // absolute, ".." that stays inside
		{"a/abs2", "{VOL}/v2"},                            // absolute, inside, from below the root
		{"a/inside", "."},                                 // the directory it is in
		{"a/parent", "../v2"},                             // ".." that stays inside
		{"chain1", "chain2"},                              // a chain of symlinks
		{"chain2", "./current"},                           //
		{"into", "current/x"},                             // through a symlink to a file
		{"fileln", "a/f"},                                 // a symlink to a file
		{"a/up", "{OUT}"},                                 // absolute, outside
		{"a/rel", "../.."},                                // relative, outside
		{"absout", "{VOL}/.."},                            // absolute, its ".." outside
		{"a/back", "../../" + filepath.Base(vol) + "/v2"}, // out of the volume and back in
		{"loop1", "loop2"},                                // a loop
		{"loop2", "loop1"},                                //
		{"self", "self"},                                  //
		{"dangling", "nothing"},                           // a target that does not exist
	} {
		to := strings.NewReplacer("{VOL}", vol, "{OUT}", outside).Replace(l[1])
		if err := os.Symlink(to, filepath.Join(vol, l[0])); err != nil {
			t.Fatal(err)
		}
	}
	return outside
}

// followedLinks are subPaths through the symlinks of symlinkVolume that
// stay in the volume, and the file each is bound to, relative to the
// volume.
var followedLinks = []struct {
	subPath string
	want    string // the file bound, relative to the volume
}{
	{"current", "v2"},
	{"current/x", "v2/x"},
	{"abs", "v2"},
	{"abs/x", "v2/x"},
	{"a/abs2/x", "v2/x"},
	{"absdots", "v2"},
	{"a/inside/f", "a/f"},
	{"a/inside/inside/inside", "a"},
	{"a/parent/x", "v2/x"},
	{"chain1/x", "v2/x"},
	{"into", "v2/x"},
	{"fileln", "a/f"},
	{"current/new/deeper", "v2/new/deeper"},
}

// refusedLinks are subPaths that symlinkVolume's other symlinks make
// Prepare refuse: the errors the refusal wraps, and the symlink or
// component it names, relative to the volume.
var refusedLinks = []struct {
	subPath string
	is      []error
	names   string // the symlink or component at fault, relative to the volume
}{
	{"a/up", []error{errEscape, ErrSymlink}, "a/up"},
	{"a/up/secret", []error{errEscape, ErrSymlink}, "a/up"},
	{"a/up/missing/x", []error{errEscape, ErrSymlink}, "a/up"},
	{"a/rel", []error{errEscape, ErrSymlink}, "a/rel"},
	{"a/rel/x", []error{errEscape, ErrSymlink}, "a/rel"},
	{"absout", []error{errEscape, ErrSymlink}, "absout"},
	{"a/back", []error{errEscape, ErrSymlink}, "a/back"},
	{"loop1", []error{unix.ELOOP, ErrSymlink}, "loop"},
	{"self/x", []error{unix.ELOOP, ErrSymlink}, "self"},
	{"dangling", []error{fs.ErrNotExist, ErrSymlink}, "dangling"},
	{"dangling/x", []error{fs.ErrNotExist, ErrSymlink}, "dangling"},
	{"file/x", []error{unix.ENOTDIR}, "file"},
	{"../x", []error{ErrInvalid}, ""},
	{"/etc", []error{ErrInvalid}, ""},
}

// TestPrepareSymlinksFake: a subPath through symlinks that stay in the
// volume is bound to the file they lead to; every other symlink is refused
// with an error naming the pod, volume, container, subPath, the symlink
// and the cause, and nothing is created or mounted.
func TestPrepareSymlinksFake(t *testing.T) {
	e := newFakeEnv(t)
	outside := symlinkVolume(t, e.vol)
	for i, tc := range followedLinks {
		t.Run(tc.subPath, func(t *testing.T) {
			got, err := e.m.Prepare(context.Background(), e.mount("app", i, tc.subPath))
			if err != nil {
				t.Fatalf("Prepare: %v", err)
			}
			if b, _ := e.fake.Bound(got); b.File != filepath.Join(e.vol, tc.want) {
				t.Errorf("%s is bound to %q, want %q", got, b.File, filepath.Join(e.vol, tc.want))
			}
		})
	}
	if err := e.m.CleanPod(context.Background(), "pod-1"); err != nil {
		t.Fatal(err)
	}

	volBefore := tree(t, e.vol)
	for _, tc := range refusedLinks {
		t.Run(tc.subPath, func(t *testing.T) {
			e.steps = nil
			_, err := e.m.Prepare(context.Background(), e.mount("app", 2, tc.subPath))
			if err == nil {
				t.Fatal("Prepare succeeded")
			}
			for _, is := range tc.is {
				if !errors.Is(err, is) {
					t.Errorf("error %v, want %v", err, is)
				}
			}
			parts := []string{"pod-1", `volume "data"`, `container "app"`, fmt.Sprintf("subPath %q", tc.subPath)}
			if tc.names != "" {
				parts = append(parts, filepath.Join(e.vol, tc.names))
			}
			for _, part := range parts {
				if !strings.Contains(err.Error(), part) {
					t.Errorf("error %q does not name %s", err, part)
				}
			}
			if len(e.steps) != 0 || len(e.fake.MountPoints) != 0 {
				t.Errorf("steps %v and mounts %v, want none", e.steps, e.fake.MountPoints)
			}
		})
	}
	if got := tree(t, e.vol); !slices.Equal(got, volBefore) {
		t.Errorf("the volume changed: %q, was %q", got, volBefore)
	}
	if got := tree(t, outside); !slices.Equal(got, []string{"secret", "secret/key"}) {
		t.Errorf("outside changed: %q", got)
	}
}

// swapCases swap what the symlink a/current -> v2 leads to after the
// walk read it and before it opens the target (swapVolume lays them out).
var swapCases = []struct {
	name  string
	swap  string // renamed to swap+".old", a symlink put in its place
	to    string // the symlink's target; {OUT} is outside the volume
	want  string // the file bound, relative to the volume; "" for refused
	wantE error
}{
	{name: "to an absolute path outside", swap: "v2", to: "{OUT}", wantE: errEscape},
	{name: "to a relative path outside", swap: "v2", to: "../../out", wantE: errEscape},
	{name: "to a loop", swap: "v2", to: "v2", wantE: unix.ELOOP},
	{name: "to a place inside", swap: "v2", to: "v3", want: "a/v3/d"},
	{name: "a directory already walked", swap: "a", to: "{OUT}", want: "a.old/v2/d"},
}

// swapVolume lays out the volume of swapCases in vol and returns the
// hook that swaps tc.swap once a/current was read, and the count of
// swaps made.
func swapVolume(t *testing.T, vol, outside, swap, to string) (func(link string), *int) {
	t.Helper()
	mkdirs(t, filepath.Join(vol, "a/v2/d"), filepath.Join(vol, "a/v3/d"), filepath.Join(outside, "d"))
	if err := os.Symlink("v2", filepath.Join(vol, "a/current")); err != nil {
		t.Fatal(err)
	}
	swapped := 0
	return func(link string) {
		if link != filepath.Join(vol, "a/current") {
			return
		}
		swapped++
		from := filepath.Join(vol, "a", swap)
		if swap == "a" {
			from = filepath.Join(vol, "a")
		}
		if err := os.Rename(from, from+".old"); err != nil {
			t.Error(err)
		}
		if err := os.Symlink(strings.ReplaceAll(to, "{OUT}", outside), from); err != nil {
			t.Error(err)
		}
	}, &swapped
}

// TestPrepareSymlinkSwappedFake swaps what a symlink leads to after the
// walk read the symlink and before it opens the target: the target is
// opened without following and judged as it is then, so a swap to a
// symlink out of the volume is refused, one inside is followed, and a
// directory the walk already holds is used even if it moved.
func TestPrepareSymlinkSwappedFake(t *testing.T) {
	for _, tc := range swapCases {
		t.Run(tc.name, func(t *testing.T) {
			e := newFakeEnv(t)
			hook, swapped := swapVolume(t, e.vol, t.TempDir(), tc.swap, tc.to)
			e.m.afterLink = hook
			target, err := e.m.Prepare(context.Background(), e.mount("app", 0, "a/current/d"))
			if *swapped != 1 {
				t.Fatalf("the swap ran %d times, want once", *swapped)
			}
			if tc.wantE != nil {
				if !errors.Is(err, tc.wantE) || !errors.Is(err, ErrSymlink) {
					t.Fatalf("Prepare = %v, want %v", err, tc.wantE)
				}
				if len(e.fake.MountPoints) != 0 {
					t.Errorf("mounts %v, want none", e.fake.MountPoints)
				}
				return
			}
			if err != nil {
				t.Fatalf("Prepare: %v", err)
			}
			if b, _ := e.fake.Bound(target); b.File != filepath.Join(e.vol, tc.want) {
				t.Errorf("%s is bound to %q, want %q", target, b.File, filepath.Join(e.vol, tc.want))
			}
		})
	}
}

// TestPrepareNotMountedFake: on mount-utils' FakeMounter, which records a
// mount and makes none, Prepare says that nothing was mounted and what a
// fake needs, not that the mount is of another file (which would read as
// a detected attack).
func TestPrepareNotMountedFake(t *testing.T) {
	vol := t.TempDir()
	mkdirs(t, filepath.Join(vol, "a"))
	m, err := New(Config{RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil)})
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.Prepare(context.Background(), Mount{Pod: "pod-1", Volume: "data", VolumePath: vol, Container: "app", SubPath: "a"})
	if !errors.Is(err, errNotMounted) || errors.Is(err, errMismatch) {
		t.Fatalf("Prepare = %v, want errNotMounted", err)
	}
	if !strings.Contains(err.Error(), "BindRecorder") {
		t.Errorf("error %q does not say what a fake mounter needs", err)
	}
}

// TestPrepareSymlinkVolumePathAlias: for a volume whose path is itself a
// symlink (a hostPath volume may be), an absolute target in the volume
// counts as inside whether it names the volume by that path or by the
// directory it resolves to, as the kubelet's EvalSymlinks of both sides
// has it; a target beside the volume does not.
func TestPrepareSymlinkVolumePathAlias(t *testing.T) {
	e := newFakeEnv(t)
	alias := filepath.Join(t.TempDir(), "alias")
	if err := os.Symlink(e.vol, alias); err != nil {
		t.Fatal(err)
	}
	mkdirs(t, filepath.Join(e.vol, "v2"))
	for name, to := range map[string]string{"byAlias": alias + "/v2", "byReal": e.vol + "/v2", "beside": e.vol + "x/v2"} {
		if err := os.Symlink(to, filepath.Join(e.vol, name)); err != nil {
			t.Fatal(err)
		}
	}
	for i, subPath := range []string{"byAlias", "byReal"} {
		s := e.mount("app", i, subPath)
		s.VolumePath = alias
		target, err := e.m.Prepare(context.Background(), s)
		if err != nil {
			t.Fatalf("Prepare %s: %v", subPath, err)
		}
		if b, _ := e.fake.Bound(target); b.File != filepath.Join(e.vol, "v2") {
			t.Errorf("%s: bound to %q, want v2", subPath, b.File)
		}
	}
	s := e.mount("app", 3, "beside")
	s.VolumePath = alias
	if _, err := e.m.Prepare(context.Background(), s); !errors.Is(err, errEscape) {
		t.Errorf("Prepare beside = %v, want errEscape", err)
	}
}

// BenchmarkOpenBeneath: what resolving a subPath costs, with no symlink
// (one openat2) and through one (the walk).
func BenchmarkOpenBeneath(b *testing.B) {
	vol := b.TempDir()
	if err := os.MkdirAll(filepath.Join(vol, "a/v2/d"), 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.Symlink("v2", filepath.Join(vol, "a/current")); err != nil {
		b.Fatal(err)
	}
	volFd, err := unix.Open(vol, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Close(volFd)
	for _, subPath := range []string{"a/v2/d", "a/current/d"} {
		b.Run(subPath, func(b *testing.B) {
			for b.Loop() {
				w, err := openBeneath(volFd, vol, strings.Split(subPath, "/"), nil)
				if err != nil {
					b.Fatal(err)
				}
				unix.Close(w.fd)
			}
		})
	}
}
