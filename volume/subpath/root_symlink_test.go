package subpath

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
)

// TestRootSymlinks runs the symlink cases on real bind mounts of a tmpfs
// volume: a subPath through symlinks that stay inside (relative, absolute,
// ".." inside, a chain, a symlink to a file) is a bind mount of the file
// they lead to, readable through the mount; an escape (relative,
// absolute), a loop or a dangling symlink mounts and creates nothing,
// and nothing outside changes.
func TestRootSymlinks(t *testing.T) {
	ctx := context.Background()
	e := newRootEnv(t)
	outside := symlinkVolume(t, e.vol)
	m := e.manager(t)
	var want []string
	for i, tc := range followedLinks {
		t.Run(tc.subPath, func(t *testing.T) {
			target, err := m.Prepare(ctx, e.mount("app", i, tc.subPath))
			if err != nil {
				t.Fatalf("Prepare: %v", err)
			}
			fi, err := os.Stat(filepath.Join(e.vol, tc.want))
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().IsRegular() {
				data, _ := os.ReadFile(filepath.Join(e.vol, tc.want))
				if got, err := os.ReadFile(target); err != nil || string(got) != string(data) {
					t.Errorf("through the mount %q, %v; want %q", got, err, data)
				}
			}
		})
		want = append(want, "pods/pod-1/volume-subpaths/data/app/"+strconv.Itoa(i)+" /"+tc.want+" tmpfs")
	}
	slices.Sort(want)
	got := e.subPathMounts(t)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("mounts:\n%q\nwant:\n%q", got, want)
	}
	if err := m.CleanPod(ctx, "pod-1"); err != nil {
		t.Fatal(err)
	}
	e.checkClean(t)

	volBefore, outsideBefore := tree(t, e.vol), tree(t, outside)
	for _, tc := range refusedLinks {
		t.Run(tc.subPath, func(t *testing.T) {
			_, err := m.Prepare(ctx, e.mount("app", 0, tc.subPath))
			for _, is := range tc.is {
				if !errors.Is(err, is) {
					t.Errorf("Prepare = %v, want %v", err, is)
				}
			}
		})
	}
	if got := e.subPathMounts(t); len(got) != 0 {
		t.Errorf("mounts: %q", got)
	}
	if _, err := os.Lstat(filepath.Join(e.root, "pods/pod-1/volume-subpaths")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("volume-subpaths was created: %v", err)
	}
	if got := tree(t, e.vol); !slices.Equal(got, volBefore) {
		t.Errorf("the volume changed: %q, was %q", got, volBefore)
	}
	if got := tree(t, outside); !slices.Equal(got, outsideBefore) {
		t.Errorf("outside changed: %q, was %q", got, outsideBefore)
	}
}

// TestRootSymlinkSwapped runs swapCases on real bind mounts: the swap
// happens after the walk read the symlink a/current and before it opens
// its target, deterministically, through the walk's test hook.
func TestRootSymlinkSwapped(t *testing.T) {
	for _, tc := range swapCases {
		t.Run(tc.name, func(t *testing.T) {
			e := newRootEnv(t)
			m := e.manager(t)
			hook, swapped := swapVolume(t, e.vol, e.outside, tc.swap, tc.to)
			m.afterLink = hook
			outsideBefore := tree(t, e.outside)
			target, err := m.Prepare(context.Background(), e.mount("app", 0, "a/current/d"))
			if *swapped != 1 {
				t.Fatalf("the swap ran %d times, want once", *swapped)
			}
			if tc.wantE != nil {
				if !errors.Is(err, tc.wantE) || !errors.Is(err, ErrSymlink) {
					t.Fatalf("Prepare = %v, want %v", err, tc.wantE)
				}
				if got := e.subPathMounts(t); len(got) != 0 {
					t.Errorf("mounts: %q", got)
				}
			} else {
				if err != nil {
					t.Fatalf("Prepare: %v", err)
				}
				want := []string{"pods/pod-1/volume-subpaths/data/app/0 /" + tc.want + " tmpfs"}
				if got := e.subPathMounts(t); !slices.Equal(got, want) {
					t.Errorf("mounts %q, want %q (%s)", got, want, target)
				}
				if err := m.CleanPod(context.Background(), "pod-1"); err != nil {
					t.Fatal(err)
				}
			}
			e.checkClean(t)
			if got := tree(t, e.outside); !slices.Equal(got, outsideBefore) {
				t.Errorf("outside changed: %q, was %q", got, outsideBefore)
			}
		})
	}
}
