package fsgroup

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

// tree makes dir/{a, sub/b, link -> outside} and returns the outside file.
func tree(t *testing.T, dir string) string {
	t.Helper()
	outside := filepath.Join(t.TempDir(), "outside")
	for _, f := range []string{filepath.Join(dir, "a"), filepath.Join(dir, "sub", "b"), outside} {
		if err := os.MkdirAll(filepath.Dir(f), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	return outside
}

func modeAndGid(t *testing.T, path string) (fs.FileMode, int64) {
	t.Helper()
	info, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return info.Mode(), int64(info.Sys().(*syscall.Stat_t).Gid)
}

// TestSetOwnership: every file and directory gets the group, group
// read-write and (directories) setgid; a symlink's target outside the
// volume keeps its mode; with OnRootMismatch a root that already has it all
// stops the walk. The group itself can only be checked as root.
func TestSetOwnership(t *testing.T) {
	gid := int64(os.Getgid())
	if os.Geteuid() == 0 {
		gid = 2000
	}
	dir := filepath.Join(t.TempDir(), "mount")
	outside := tree(t, dir)
	if err := Set(context.Background(), dir, gid, false); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path string
		want fs.FileMode
	}{
		{dir, fs.ModeDir | fs.ModeSetgid | 0o770},
		{filepath.Join(dir, "sub"), fs.ModeDir | fs.ModeSetgid | 0o770},
		{filepath.Join(dir, "a"), 0o660},
		{filepath.Join(dir, "sub", "b"), 0o660},
		{outside, 0o600},
	} {
		mode, g := modeAndGid(t, tc.path)
		if mode != tc.want {
			t.Errorf("%s: mode %v, want %v", tc.path, mode, tc.want)
		}
		if tc.path != outside && g != gid {
			t.Errorf("%s: group %d, want %d", tc.path, g, gid)
		}
	}

	// The root has it all: OnRootMismatch does not look further.
	newFile := filepath.Join(dir, "new")
	if err := os.WriteFile(newFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Set(context.Background(), dir, gid, true); err != nil {
		t.Fatal(err)
	}
	if mode, _ := modeAndGid(t, newFile); mode != 0o600 {
		t.Errorf("OnRootMismatch with a matching root changed %s to %v", newFile, mode)
	}
	// Always (the default) walks again.
	if err := Set(context.Background(), dir, gid, false); err != nil {
		t.Fatal(err)
	}
	if mode, _ := modeAndGid(t, newFile); mode != 0o660 {
		t.Errorf("Always left %s at %v", newFile, mode)
	}
}

func TestWalkChildrenFirst(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "mount")
	tree(t, dir)
	var order []string
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := walkChildrenFirst(context.Background(), d, func(p string, _ int, _ fs.FileInfo) { order = append(order, p) }); err != nil {
		t.Fatal(err)
	}
	pos := func(p string) int { return slices.Index(order, filepath.Join(dir, p)) }
	if len(order) != 5 || pos("") != 4 || pos("sub/b") > pos("sub") || pos("sub") < 0 || pos("link") < 0 {
		t.Errorf("walk order %v: want every entry once, each directory after its entries, the root last", order)
	}
}

// TestSetOwnershipRace swaps a directory of a volume for a symlink to a
// directory outside the root and back, as a pod could while nodevol gives
// the volume to its fsGroup: the walk never changes the mode (or group)
// of anything outside.
func TestSetOwnershipRace(t *testing.T) {
	gid := int64(os.Getgid())
	if os.Geteuid() == 0 {
		gid = 2000
	}
	vol := filepath.Join(t.TempDir(), "mount")
	out := t.TempDir()
	if err := os.WriteFile(filepath.Join(out, "secret"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(out, 0o700); err != nil {
		t.Fatal(err)
	}
	sub, link, aside := filepath.Join(vol, "sub"), filepath.Join(vol, "link"), filepath.Join(vol, "aside")
	if err := os.MkdirAll(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sub, "secret"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(out, link); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = os.Rename(sub, aside)
			_ = os.Rename(link, sub)
			_ = os.Rename(sub, link)
			_ = os.Rename(aside, sub)
		}
	}()
	for range 2000 {
		_ = Set(context.Background(), vol, gid, false)
	}
	close(stop)
	<-done
	for _, p := range []string{out, filepath.Join(out, "secret")} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[bool]fs.FileMode{true: fs.ModeDir | 0o700, false: 0o600}[fi.IsDir()]; fi.Mode() != want {
			t.Errorf("%s outside the volume: mode %v, want %v", p, fi.Mode(), want)
		}
	}
}
