package hostpath

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/step"
)

// hostTree makes, in a temp dir, one thing of each kind a hostPath can
// name, and returns the dir.
func hostTree(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	mustDo(t, os.Mkdir(filepath.Join(dir, "d"), 0o755))
	mustDo(t, os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644))
	mustDo(t, os.Symlink("d", filepath.Join(dir, "ld")))
	mustDo(t, os.Symlink("f", filepath.Join(dir, "lf")))
	mustDo(t, os.Symlink("nowhere", filepath.Join(dir, "dangling")))
	mustDo(t, os.Symlink("sock", filepath.Join(dir, "lsock")))
	mustDo(t, os.Symlink("loop", filepath.Join(dir, "loop")))
	mustDo(t, unix.Mkfifo(filepath.Join(dir, "fifo"), 0o644))
	hostTreeSocket(t, filepath.Join(dir, "sock"))
	return dir
}

// hostTreeSocket makes a unix socket at path, listening until the test ends.
func hostTreeSocket(t *testing.T, path string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	mustDo(t, err)
	t.Cleanup(func() { l.Close() })
}

func mustDo(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// fakeInfo is a FileInfo of any mode, for the kinds of file a test cannot
// make without root (a block device).
type fakeInfo struct{ mode fs.FileMode }

func (f fakeInfo) Name() string       { return "fake" }
func (f fakeInfo) Size() int64        { return 0 }
func (f fakeInfo) Mode() fs.FileMode  { return f.mode }
func (f fakeInfo) ModTime() time.Time { return time.Time{} }
func (f fakeInfo) IsDir() bool        { return f.mode.IsDir() }
func (f fakeInfo) Sys() any           { return nil }

// statWith returns os.Stat, except that path is shown with mode.
func statWith(path string, mode fs.FileMode) func(string) (fs.FileInfo, error) {
	return func(p string) (fs.FileInfo, error) {
		if p == path {
			return fakeInfo{mode: mode}, nil
		}
		return os.Stat(p)
	}
}

// realBlockDevice returns a block device node of this machine, "" when it
// has none.
func realBlockDevice() string {
	entries, err := os.ReadDir("/dev")
	if err != nil {
		return ""
	}
	for _, e := range entries {
		if e.Type()&fs.ModeDevice != 0 && e.Type()&fs.ModeCharDevice == 0 {
			return filepath.Join("/dev", e.Name())
		}
	}
	return ""
}

// TestCheck: the kubelet's type check of every type against every kind of
// file, with its error texts; nothing is created but by the *OrCreate
// types, which are tested on what exists here.
func TestCheck(t *testing.T) {
	dir := hostTree(t)
	at := func(name string) string { return filepath.Join(dir, name) }
	fakeBlock := at("fake-block")
	notExist := func(name string, expected string) string {
		return fmt.Sprintf("hostPath type check failed, %s is not a %s, unable to determine its type: path %q does not exist", at(name), expected, at(name))
	}
	mismatch := func(path, expected, found string) string {
		return fmt.Sprintf("hostPath type check failed: %s is not a %s, it's a %s", path, expected, found)
	}
	type tc struct {
		name string
		typ  v1.HostPathType
		path string
		want string // the error; "" for none
	}
	tests := []tc{
		{"unset checks nothing", v1.HostPathUnset, at("missing"), ""},
		{"unset on a fifo", v1.HostPathUnset, at("fifo"), ""},
		{"directory", v1.HostPathDirectory, at("d"), ""},
		{"directory through a symlink", v1.HostPathDirectory, at("ld"), ""},
		{"directory is a file", v1.HostPathDirectory, at("f"), mismatch(at("f"), "directory", "File")},
		{"directory is missing", v1.HostPathDirectory, at("missing"), notExist("missing", "directory")},
		{"directory is a dangling symlink", v1.HostPathDirectory, at("dangling"), notExist("dangling", "directory")},
		{"directory or create on a directory", v1.HostPathDirectoryOrCreate, at("d"), ""},
		{"directory or create on a file", v1.HostPathDirectoryOrCreate, at("f"), mismatch(at("f"), "directory", "File")},
		{"directory or create on a socket", v1.HostPathDirectoryOrCreate, at("sock"), mismatch(at("sock"), "directory", "Socket")},
		{"directory or create on a symlink loop", v1.HostPathDirectoryOrCreate, at("loop"),
			fmt.Sprintf("hostPath type check failed, %s is not a directory, unable to determine its type: stat %s: too many levels of symbolic links", at("loop"), at("loop"))},
		{"file or create on a symlink loop", v1.HostPathFileOrCreate, at("loop"),
			fmt.Sprintf("hostPath type check failed, %s is not a file, unable to determine its type: stat %s: too many levels of symbolic links", at("loop"), at("loop"))},
		{"file", v1.HostPathFile, at("f"), ""},
		{"file through a symlink", v1.HostPathFile, at("lf"), ""},
		{"file is a directory", v1.HostPathFile, at("d"), mismatch(at("d"), "file", "Directory")},
		{"file is missing", v1.HostPathFile, at("missing"), notExist("missing", "file")},
		{"file is a fifo", v1.HostPathFile, at("fifo"), fmt.Sprintf("hostPath type check failed, %s is not a file, unable to determine its type: %v", at("fifo"), errUnknownFileType)},
		{"file or create on a file", v1.HostPathFileOrCreate, at("f"), ""},
		{"file or create on a directory", v1.HostPathFileOrCreate, at("d"), mismatch(at("d"), "file", "Directory")},
		{"file or create on a char device", v1.HostPathFileOrCreate, "/dev/null", mismatch("/dev/null", "file", "CharDevice")},
		{"socket", v1.HostPathSocket, at("sock"), ""},
		{"socket through a symlink", v1.HostPathSocket, at("lsock"), ""},
		{"socket is a file", v1.HostPathSocket, at("f"), mismatch(at("f"), "socket file", "File")},
		{"socket is missing", v1.HostPathSocket, at("missing"), notExist("missing", "socket file")},
		{"char device", v1.HostPathCharDev, "/dev/null", ""},
		{"char device is a directory", v1.HostPathCharDev, at("d"), mismatch(at("d"), "character device", "Directory")},
		{"char device is a block device", v1.HostPathCharDev, fakeBlock, mismatch(fakeBlock, "character device", "BlockDevice")},
		{"block device", v1.HostPathBlockDev, fakeBlock, ""},
		{"block device is a char device", v1.HostPathBlockDev, "/dev/null", mismatch("/dev/null", "block device", "CharDevice")},
		{"block device is a file", v1.HostPathBlockDev, at("f"), mismatch(at("f"), "block device", "File")},
		{"block device is a socket", v1.HostPathBlockDev, at("sock"), mismatch(at("sock"), "block device", "Socket")},
		{"block device is missing", v1.HostPathBlockDev, at("missing"), notExist("missing", "block device")},
		{"unknown type", "Pipe", at("f"), "Pipe is an invalid volume type"},
	}
	if dev := realBlockDevice(); dev != "" {
		tests = append(tests,
			tc{"real block device " + dev, v1.HostPathBlockDev, dev, ""},
			tc{"real block device is not a char device", v1.HostPathCharDev, dev, mismatch(dev, "character device", "BlockDevice")})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var steps []step.Step
			p := &plugin{stat: statWith(fakeBlock, fs.ModeDevice|0o660), steps: func(s step.Step) error {
				steps = append(steps, s)
				return nil
			}}
			err := p.check(tt.path, tt.typ)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("check(%s, %s) = %v, want no error", tt.path, tt.typ, err)
			case tt.want != "" && (err == nil || err.Error() != tt.want):
				t.Fatalf("check(%s, %s) = %v, want %s", tt.path, tt.typ, err, tt.want)
			}
			if len(steps) != 0 {
				t.Errorf("steps %v, want none: nothing to create", steps)
			}
		})
	}
	if _, err := os.Lstat(at("missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s was created: %v", at("missing"), err)
	}
}

// TestFileType: the kubelet's classification of every mode.
func TestFileType(t *testing.T) {
	for _, tt := range []struct {
		mode fs.FileMode
		want v1.HostPathType
	}{
		{fs.ModeDir | 0o755, v1.HostPathDirectory},
		{0o644, v1.HostPathFile},
		{fs.ModeSocket | 0o777, v1.HostPathSocket},
		{fs.ModeDevice | fs.ModeCharDevice | 0o666, v1.HostPathCharDev},
		{fs.ModeDevice | 0o660, v1.HostPathBlockDev},
		{fs.ModeNamedPipe | 0o644, ""},
		{fs.ModeSymlink | 0o777, ""},
		{fs.ModeIrregular, ""},
	} {
		got, err := fileType(tt.mode)
		if got != tt.want || (tt.want == "") != errors.Is(err, errUnknownFileType) {
			t.Errorf("fileType(%v) = %q, %v; want %q", tt.mode, got, err, tt.want)
		}
	}
}

// withUmask sets the process's umask for the test.
func withUmask(t *testing.T, mask int) {
	old := unix.Umask(mask)
	t.Cleanup(func() { unix.Umask(old) })
}

// TestCreate: DirectoryOrCreate makes the directory and its missing
// parents, FileOrCreate the file in an existing directory, each with the
// kubelet's mode less the umask, each announced to the step hook; nothing
// else is made, and a second check makes nothing.
func TestCreate(t *testing.T) {
	tests := []struct {
		name  string
		typ   v1.HostPathType
		path  string   // under the tree
		steps []string // the paths announced, under the tree
		made  []string // what is made, under the tree
		want  string   // the error, "" for none; %s is the tree
	}{
		{"directory", v1.HostPathDirectoryOrCreate, "new", []string{"new"}, []string{"new"}, ""},
		{"directory and its parents", v1.HostPathDirectoryOrCreate, "a/b/c", []string{"a", "a/b", "a/b/c"}, []string{"a", "a/b", "a/b/c"}, ""},
		{"directory under an existing one", v1.HostPathDirectoryOrCreate, "d/e", []string{"d/e"}, []string{"d/e"}, ""},
		{"directory through a symlinked parent", v1.HostPathDirectoryOrCreate, "ld/e", []string{"ld/e"}, []string{"d/e"}, ""},
		{"directory with a trailing slash", v1.HostPathDirectoryOrCreate, "t/", []string{"t"}, []string{"t"}, ""},
		{"directory under a file", v1.HostPathDirectoryOrCreate, "f/e", nil, nil, "mkdir %s/f: not a directory"},
		{"directory under a dangling symlink", v1.HostPathDirectoryOrCreate, "dangling/e", []string{"dangling"}, nil, "mkdir %s/dangling: file exists"},
		{"directory at a dangling symlink", v1.HostPathDirectoryOrCreate, "dangling", []string{"dangling"}, nil, "mkdir %s/dangling: file exists"},
		{"file", v1.HostPathFileOrCreate, "new", []string{"new"}, []string{"new"}, ""},
		{"file in an existing directory", v1.HostPathFileOrCreate, "d/new", []string{"d/new"}, []string{"d/new"}, ""},
		{"file through a dangling symlink", v1.HostPathFileOrCreate, "dangling", []string{"dangling"}, []string{"nowhere"}, ""},
		{"file under a file", v1.HostPathFileOrCreate, "f/new", []string{"f/new"}, nil, "open %s/f/new: not a directory"},
		{"file without its directory", v1.HostPathFileOrCreate, "a/new", []string{"a/new"}, nil, "open %s/a/new: no such file or directory"},
	}
	for _, mask := range []int{0o022, 0o077, 0} {
		for _, tt := range tests {
			t.Run(fmt.Sprintf("%s umask %03o", tt.name, mask), func(t *testing.T) {
				withUmask(t, mask)
				dir := hostTree(t)
				before := listTree(t, dir)
				var steps []step.Step
				p := &plugin{stat: os.Stat, steps: func(s step.Step) error {
					steps = append(steps, s)
					return nil
				}}
				path := dir + "/" + tt.path
				err := p.check(path, tt.typ)
				if tt.want != "" {
					if err == nil || err.Error() != fmt.Sprintf(tt.want, dir) {
						t.Fatalf("check = %v, want %s", err, fmt.Sprintf(tt.want, dir))
					}
				} else if err != nil {
					t.Fatalf("check = %v", err)
				}
				op, mode := step.Mkdir, fs.ModeDir|dirMode
				if tt.typ == v1.HostPathFileOrCreate {
					op, mode = step.Create, fileMode
				}
				var wantSteps []step.Step
				for _, s := range tt.steps {
					wantSteps = append(wantSteps, step.Step{Op: op, Path: filepath.Join(dir, s)})
				}
				if !slices.Equal(steps, wantSteps) {
					t.Errorf("steps %v, want %v", steps, wantSteps)
				}
				after := listTree(t, dir)
				for _, m := range tt.made {
					want := mode &^ fs.FileMode(mask)
					if got, ok := after[m]; !ok || got != want {
						t.Errorf("%s: mode %v (made %v), want %v", m, got, ok, want)
					}
					delete(after, m)
				}
				if !mapsEqual(before, after) {
					t.Errorf("tree changed beyond %v: before %v, after %v", tt.made, before, after)
				}
				if err == nil {
					steps = nil
					if err := p.check(path, tt.typ); err != nil || len(steps) != 0 {
						t.Errorf("second check = %v, steps %v; want no error and no step", err, steps)
					}
				}
			})
		}
	}
}

// listTree returns the modes of everything under dir, by relative path,
// symlinks not followed.
func listTree(t *testing.T, dir string) map[string]fs.FileMode {
	t.Helper()
	out := map[string]fs.FileMode{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		out[rel] = fi.Mode()
		return nil
	})
	mustDo(t, err)
	return out
}

func mapsEqual(a, b map[string]fs.FileMode) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestCreateCrash: a step refused (a process stopped there) leaves what
// was made before it, and a check run again goes on from there.
func TestCreateCrash(t *testing.T) {
	withUmask(t, 0o022)
	dir := t.TempDir()
	path := filepath.Join(dir, "a", "b", "c")
	for at := 1; at <= 3; at++ {
		t.Run(fmt.Sprintf("stop at step %d", at), func(t *testing.T) {
			mustDo(t, os.RemoveAll(filepath.Join(dir, "a")))
			stop := errors.New("stopped")
			n := 0
			p := &plugin{stat: os.Stat, steps: func(step.Step) error {
				n++
				if n >= at {
					return stop
				}
				return nil
			}}
			if err := p.check(path, v1.HostPathDirectoryOrCreate); !errors.Is(err, stop) {
				t.Fatalf("check = %v, want the hook's error", err)
			}
			made := []string{filepath.Join(dir, "a"), filepath.Join(dir, "a", "b"), path}
			for i, m := range made {
				_, err := os.Stat(m)
				if exists := err == nil; exists != (i < at-1) {
					t.Errorf("after stopping at step %d: %s exists %v", at, m, exists)
				}
			}
			p.steps = nil
			if err := p.check(path, v1.HostPathDirectoryOrCreate); err != nil {
				t.Fatalf("check again = %v", err)
			}
			if fi, err := os.Stat(path); err != nil || fi.Mode() != fs.ModeDir|0o755 {
				t.Errorf("%s after the retry: %v, %v", path, fi, err)
			}
		})
	}
}
