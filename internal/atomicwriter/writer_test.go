package atomicwriter

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodevol/nodevol/internal/rootfs"
)

const volDir = "pods/uid/volumes/kubernetes.io~configmap/v"

// setup returns a root in a temporary directory with the volume's
// directory made, and that directory's absolute path.
func setup(t *testing.T) (*rootfs.Root, string) {
	t.Helper()
	root, err := rootfs.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root.Path(), volDir)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	return root, dir
}

func newWriter(t *testing.T, root *rootfs.Root, opts Options) *Writer {
	t.Helper()
	w, err := New(root, volDir, opts)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

var tsName = regexp.MustCompile(`\.\.\d{4}_\d\d_\d\d_\d\d_\d\d_\d\d\.\d+`)

// tree lists dir, not following symlinks, one line per entry: "path ->
// target" for a link, "path/ mode" for a directory, "path mode content"
// for a file; timestamped directories read ..V1, ..V2... in name order
// (the order they were made in).
func tree(t *testing.T, dir string) string {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			lines = append(lines, fmt.Sprintf("%s -> %s", rel, target))
		case fi.IsDir():
			lines = append(lines, fmt.Sprintf("%s/ %v", rel, fi.Mode()))
		default:
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			lines = append(lines, fmt.Sprintf("%s %v %s", rel, fi.Mode(), data))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	return tsName.ReplaceAllStringFunc(strings.Join(lines, "\n"), func(ts string) string {
		if names[ts] == "" {
			names[ts] = fmt.Sprintf("..V%d", len(names)+1)
		}
		return names[ts]
	})
}

func files(kv ...string) map[string]File {
	p := map[string]File{}
	for i := 0; i < len(kv); i += 2 {
		p[kv[i]] = File{Data: []byte(kv[i+1]), Mode: 0o644}
	}
	return p
}

func TestWrite(t *testing.T) {
	type write struct {
		payload map[string]File
		changed bool
		tree    string
	}
	for _, tc := range []struct {
		name   string
		writes []write
	}{
		{
			name: "first write, nested paths, then the same",
			writes: []write{{
				payload: files("a", "A", "d/e/f", "F", "d/g", "G"),
				changed: true,
				tree: `..V1/ drwxr-xr-x
..V1/a -rw-r--r-- A
..V1/d/ drwxr-xr-x
..V1/d/e/ drwxr-xr-x
..V1/d/e/f -rw-r--r-- F
..V1/d/g -rw-r--r-- G
..data -> ..V1
a -> ..data/a
d -> ..data/d`,
			}, {
				payload: files("d/g", "G", "a", "A", "d/e/f", "F"),
				tree: `..V1/ drwxr-xr-x
..V1/a -rw-r--r-- A
..V1/d/ drwxr-xr-x
..V1/d/e/ drwxr-xr-x
..V1/d/e/f -rw-r--r-- F
..V1/d/g -rw-r--r-- G
..data -> ..V1
a -> ..data/a
d -> ..data/d`,
			}},
		},
		{
			name: "update, add and remove keys",
			writes: []write{{
				payload: files("a", "A", "b", "B"),
				changed: true,
			}, {
				payload: files("a", "A2", "c/x", "X"),
				changed: true,
				tree: `..V1/ drwxr-xr-x
..V1/a -rw-r--r-- A
..V1/b -rw-r--r-- B
..V2/ drwxr-xr-x
..V2/a -rw-r--r-- A2
..V2/c/ drwxr-xr-x
..V2/c/x -rw-r--r-- X
..data -> ..V2
a -> ..data/a
c -> ..data/c`,
			}, {
				payload: map[string]File{},
				changed: true,
				tree: `..V1/ drwxr-xr-x
..V1/a -rw-r--r-- A2
..V1/c/ drwxr-xr-x
..V1/c/x -rw-r--r-- X
..V2/ drwxr-xr-x
..data -> ..V2`,
			}, {
				payload: map[string]File{},
				tree: `..V1/ drwxr-xr-x
..data -> ..V1`,
			}},
		},
		{
			name: "a mode change alone is written",
			writes: []write{{
				payload: files("a", "A"),
				changed: true,
			}, {
				payload: map[string]File{"a": {Data: []byte("A"), Mode: 0o400}},
				changed: true,
				tree: `..V1/ drwxr-xr-x
..V1/a -rw-r--r-- A
..V2/ drwxr-xr-x
..V2/a -r-------- A
..data -> ..V2
a -> ..data/a`,
			}},
		},
		{
			name: "a file becomes a directory",
			writes: []write{{
				payload: files("a", "A"),
				changed: true,
			}, {
				payload: files("a/b", "B"),
				changed: true,
				tree: `..V1/ drwxr-xr-x
..V1/a -rw-r--r-- A
..V2/ drwxr-xr-x
..V2/a/ drwxr-xr-x
..V2/a/b -rw-r--r-- B
..data -> ..V2
a -> ..data/a`,
			}, {
				payload: files("a/b", "B"),
				tree: `..V1/ drwxr-xr-x
..V1/a/ drwxr-xr-x
..V1/a/b -rw-r--r-- B
..data -> ..V1
a -> ..data/a`,
			}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root, dir := setup(t)
			w := newWriter(t, root, Options{})
			for i, wr := range tc.writes {
				changed, err := w.Write(context.Background(), wr.payload)
				if err != nil {
					t.Fatalf("write %d: %v", i, err)
				}
				if changed != wr.changed {
					t.Errorf("write %d: changed = %v, want %v", i, changed, wr.changed)
				}
				if got := tree(t, dir); wr.tree != "" && got != wr.tree {
					t.Errorf("write %d: tree:\n%s\nwant:\n%s", i, got, wr.tree)
				}
				checkVisible(t, dir, wr.payload)
			}
		})
	}
}

// checkVisible checks that every path of payload reads its content
// through the user-visible links.
func checkVisible(t *testing.T, dir string, payload map[string]File) {
	t.Helper()
	for p, f := range payload {
		data, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil || string(data) != string(f.Data) {
			t.Errorf("%s reads %q, %v; want %q", p, data, err, f.Data)
		}
	}
}

func TestWriteRepairs(t *testing.T) {
	root, dir := setup(t)
	w := newWriter(t, root, Options{Now: func() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) }})
	payload := files("a", "A", "b/c", "C")
	if _, err := w.Write(context.Background(), payload); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	if !slices.ContainsFunc(entries, func(e os.DirEntry) bool { return strings.HasPrefix(e.Name(), "..2026_01_02_03_04_05.") }) {
		t.Fatalf("no timestamped directory named after Now in %v", entries)
	}
	// What an interrupted Write, a removed link and others leave.
	for _, step := range []func() error{
		func() error { return os.Remove(filepath.Join(dir, "a")) },
		func() error { return os.Mkdir(filepath.Join(dir, "..2020_01_01_00_00_00.1"), 0o755) },
		func() error { return os.WriteFile(filepath.Join(dir, "..2020_01_01_00_00_00.1", "x"), nil, 0o644) },
		func() error { return os.Symlink("..2020_01_01_00_00_00.1", filepath.Join(dir, "..data_tmp")) },
		func() error { return os.Symlink("..data/gone", filepath.Join(dir, "gone")) },
		// Not the writer's: stay.
		func() error { return os.Symlink("elsewhere", filepath.Join(dir, "other")) },
		func() error { return os.Mkdir(filepath.Join(dir, "mnt"), 0o755) },
		func() error { return os.Mkdir(filepath.Join(dir, "..keep"), 0o755) },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	changed, err := w.Write(context.Background(), payload)
	if err != nil || !changed {
		t.Fatalf("Write = %v, %v; want changed (links made and removed)", changed, err)
	}
	want := `..V1/ drwxr-xr-x
..V1/a -rw-r--r-- A
..V1/b/ drwxr-xr-x
..V1/b/c -rw-r--r-- C
..data -> ..V1
..keep/ drwxr-xr-x
a -> ..data/a
b -> ..data/b
mnt/ drwxr-xr-x
other -> elsewhere`
	if got := tree(t, dir); got != want {
		t.Errorf("tree:\n%s\nwant:\n%s", got, want)
	}
	checkVisible(t, dir, payload)
}

// TestTakeOver writes over a directory the kubelet's writer left: an
// equal payload changes nothing, a new one replaces it.
func TestTakeOver(t *testing.T) {
	root, dir := setup(t)
	ts := "..2025_12_31_23_59_59.3141592653"
	for _, step := range []func() error{
		func() error { return os.Mkdir(filepath.Join(dir, ts), 0o755) },
		func() error { return os.Chmod(filepath.Join(dir, ts), 0o755) },
		func() error { return os.WriteFile(filepath.Join(dir, ts, "k"), []byte("V"), 0o644) },
		func() error { return os.Chmod(filepath.Join(dir, ts, "k"), 0o644) },
		func() error { return os.Symlink(ts, filepath.Join(dir, "..data")) },
		func() error { return os.Symlink("..data/k", filepath.Join(dir, "k")) },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	w := newWriter(t, root, Options{})
	if changed, err := w.Write(context.Background(), files("k", "V")); err != nil || changed {
		t.Fatalf("Write of the same = %v, %v; want unchanged", changed, err)
	}
	if target, _ := os.Readlink(filepath.Join(dir, "..data")); target != ts {
		t.Fatalf("..data -> %s, want %s kept", target, ts)
	}
	if changed, err := w.Write(context.Background(), files("k", "V2")); err != nil || !changed {
		t.Fatalf("Write = %v, %v; want changed", changed, err)
	}
	if _, err := os.Lstat(filepath.Join(dir, ts)); err != nil {
		t.Errorf("the version replaced is not kept until the next Write: %v", err)
	}
	if changed, err := w.Write(context.Background(), files("k", "V2")); err != nil || changed {
		t.Fatalf("Write of the same = %v, %v; want unchanged", changed, err)
	}
	if _, err := os.Lstat(filepath.Join(dir, ts)); !os.IsNotExist(err) {
		t.Errorf("the kubelet's version is still there: %v", err)
	}
	checkVisible(t, dir, files("k", "V2"))
}

func TestWriteRefuses(t *testing.T) {
	for _, tc := range []struct {
		name    string
		prepare func(dir string) error
		payload map[string]File
		err     string
	}{
		{name: "invalid path", payload: files("a", "A", "../x", "X"), err: "must not contain '..'"},
		{name: "absolute path", payload: files("/etc/x", "X"), err: "must be relative path"},
		{name: "conflicting paths", payload: files("a", "A", "a/b", "B"), err: "conflicting payload paths"},
		{
			name:    "..data not a link",
			prepare: func(dir string) error { return os.Mkdir(filepath.Join(dir, "..data"), 0o755) },
			payload: files("a", "A"), err: "is not a symlink",
		},
		{
			name:    "..data leaving the directory",
			prepare: func(dir string) error { return os.Symlink("../../..", filepath.Join(dir, "..data")) },
			payload: files("a", "A"), err: "not to a timestamped directory",
		},
		{
			name: "version a symlink",
			prepare: func(dir string) error {
				if err := os.Symlink("/etc", filepath.Join(dir, "..x")); err != nil {
					return err
				}
				return os.Symlink("..x", filepath.Join(dir, "..data"))
			},
			payload: files("a", "A"), err: "",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root, dir := setup(t)
			if tc.prepare != nil {
				if err := tc.prepare(dir); err != nil {
					t.Fatal(err)
				}
			}
			before := tree(t, dir)
			w := newWriter(t, root, Options{})
			_, err := w.Write(context.Background(), tc.payload)
			if tc.err == "" {
				// A version that is a symlink is not read through: it is
				// not up to date, a new version replaces it.
				if err != nil {
					t.Fatal(err)
				}
				checkVisible(t, dir, tc.payload)
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), dir) {
				t.Fatalf("err = %v, want %q naming %s", err, tc.err, dir)
			}
			if got := tree(t, dir); got != before {
				t.Errorf("tree changed:\n%s\nwas:\n%s", got, before)
			}
		})
	}
}

func TestNew(t *testing.T) {
	root, dir := setup(t)
	if err := os.Symlink(dir, filepath.Join(root.Path(), "link")); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"link", "missing", "../x"} {
		if _, err := New(root, d, Options{}); err == nil {
			t.Errorf("New(%q) succeeded", d)
		}
	}
	w, err := New(root, dir, Options{})
	if err != nil || w.Dir() != dir {
		t.Fatalf("New(%s) = %v, %v", dir, w, err)
	}
}

func TestWriteCancelled(t *testing.T) {
	root, dir := setup(t)
	w := newWriter(t, root, Options{})
	if _, err := w.Write(context.Background(), files("a", "A")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := w.Write(ctx, files("a", "B")); err == nil {
		t.Fatal("a cancelled Write succeeded")
	}
	checkVisible(t, dir, files("a", "A"))
}
