package poddir

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/internal/rootfs"
	"github.com/nodevol/nodevol/internal/roottest"
)

const uid = types.UID("0d3b5a8e-pod")

// tree builds files under dir: a name ending in "/" is a directory, one
// with "->" a symlink to what follows, "|fifo" a FIFO, anything else a
// file holding its name.
func tree(t *testing.T, dir string, names ...string) {
	t.Helper()
	for _, n := range names {
		var err error
		switch {
		case strings.Contains(n, "->"):
			name, target, _ := strings.Cut(n, "->")
			p := filepath.Join(dir, name)
			mkdirAll(t, filepath.Dir(p))
			err = os.Symlink(strings.ReplaceAll(target, "$OUT", os.Getenv("POD_TEST_OUT")), p)
		case strings.HasSuffix(n, "|fifo"):
			p := filepath.Join(dir, strings.TrimSuffix(n, "|fifo"))
			mkdirAll(t, filepath.Dir(p))
			err = syscall.Mkfifo(p, 0o600)
		case strings.HasSuffix(n, "/"):
			mkdirAll(t, filepath.Join(dir, n))
		case strings.HasSuffix(n, "|empty"):
			p := filepath.Join(dir, strings.TrimSuffix(n, "|empty"))
			mkdirAll(t, filepath.Dir(p))
			err = os.WriteFile(p, nil, 0o644)
		default:
			p := filepath.Join(dir, n)
			mkdirAll(t, filepath.Dir(p))
			err = os.WriteFile(p, []byte(n), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func mkdirAll(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
}

// listTree returns every path below dir, relative, sorted; directories end
// in "/". Symlinks are listed, not followed.
func listTree(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == dir {
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		if d.IsDir() {
			rel += "/"
		}
		out = append(out, rel)
		return nil
	})
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// kept returns the kept paths of err (relative to the pod directory) and
// their reasons' texts.
func kept(t *testing.T, err error, podDir string) map[string]error {
	t.Helper()
	var ke *KeptError
	if !errors.As(err, &ke) {
		t.Fatalf("error %v is not a *KeptError", err)
	}
	out := map[string]error{}
	for _, k := range ke.Kept {
		rel, _ := filepath.Rel(podDir, k.Path)
		out[rel] = k.Reason
	}
	return out
}

// TestRemove: what goes and what stays, without mounts (table): the
// kubelet's and nodevol's files and empty directories go, symlinks go as
// links and are never followed, anything that may hold data stays with
// the directories above it and is named with its reason.
func TestRemove(t *testing.T) {
	// The directories and files a pod with every kind of volume leaves once
	// its volumes are torn down and its containers gone.
	leftByAPod := []string{
		"volumes/kubernetes.io~csi/pv-1/", "volumes/kubernetes.io~empty-dir/cache/",
		"volumes/kubernetes.io~configmap/cm/", "volumes/kubernetes.io~projected/kube-api-access-x/",
		"volume-subpaths/cache/app/0/", "volume-subpaths/cm/app/1|empty",
		"volumeDevices/kubernetes.io~csi/",
		"plugins/kubernetes.io~empty-dir/cache/ready", "plugins/kubernetes.io~empty-dir/wrapped_cm/ready",
		"containers/app/7f3c2a10", "containers/init/0bd3e1aa",
		"etc-hosts",
	}
	tests := []struct {
		name  string
		files []string
		// mountTable: absolute paths (below the pod directory, relative
		// here) the caller's mount table lists.
		mountTable []string
		// wantKept maps what stays (relative to the pod directory) to its
		// reason; nil: the pod directory is gone.
		wantKept  map[string]error
		untouched bool
		// wantLeft is what is left in the pod directory, when it stays.
		wantLeft []string
	}{
		{name: "no directory"},
		{name: "what a pod leaves", files: leftByAPod},
		{
			name: "symlinks are removed as links, never followed",
			files: append(slices.Clone(leftByAPod),
				"volumes/kubernetes.io~empty-dir/evil->$OUT", "escape->$OUT/data", "volume-subpaths/v/app/0->/",
				"containers/app/log->$OUT/data"),
		},
		{
			name:     "a file left in a volume directory is kept",
			files:    append(slices.Clone(leftByAPod), "volumes/kubernetes.io~empty-dir/cache/user.db"),
			wantKept: map[string]error{"volumes/kubernetes.io~empty-dir/cache/user.db": ErrNotOurs},
			wantLeft: []string{"volumes/", "volumes/kubernetes.io~empty-dir/", "volumes/kubernetes.io~empty-dir/cache/",
				"volumes/kubernetes.io~empty-dir/cache/user.db"},
		},
		{
			name:     "a vol_data.json is kept: the volume was not torn down",
			files:    []string{"volumes/kubernetes.io~csi/pv-1/vol_data.json", "etc-hosts"},
			wantKept: map[string]error{"volumes/kubernetes.io~csi/pv-1/vol_data.json": ErrNotOurs},
			wantLeft: []string{"volumes/", "volumes/kubernetes.io~csi/", "volumes/kubernetes.io~csi/pv-1/",
				"volumes/kubernetes.io~csi/pv-1/vol_data.json"},
		},
		{
			name:     "a subPath target with data in it is kept",
			files:    []string{"volume-subpaths/cm/app/0"},
			wantKept: map[string]error{"volume-subpaths/cm/app/0": ErrNotOurs},
			wantLeft: []string{"volume-subpaths/", "volume-subpaths/cm/", "volume-subpaths/cm/app/", "volume-subpaths/cm/app/0"},
		},
		{
			name:     "unknown files and special files are kept",
			files:    []string{"notes.txt", "containers/app/sock|fifo", "plugins/kubernetes.io~empty-dir/cache/other"},
			wantKept: map[string]error{"notes.txt": ErrNotOurs, "containers/app/sock": ErrNotOurs, "plugins/kubernetes.io~empty-dir/cache/other": ErrNotOurs},
			wantLeft: []string{"containers/", "containers/app/", "containers/app/sock", "notes.txt",
				"plugins/", "plugins/kubernetes.io~empty-dir/", "plugins/kubernetes.io~empty-dir/cache/",
				"plugins/kubernetes.io~empty-dir/cache/other"},
		},
		{
			name:       "a mount point in the caller's table stops it before anything is removed",
			files:      leftByAPod,
			mountTable: []string{"volumes/kubernetes.io~csi/pv-1"},
			wantKept:   map[string]error{"volumes/kubernetes.io~csi/pv-1": ErrMountPoint},
			untouched:  true,
			wantLeft:   listOf(leftByAPod),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := t.TempDir()
			rootDir, out := filepath.Join(base, "root"), filepath.Join(base, "outside")
			tree(t, out, "data", "empty/", "sub/file")
			t.Setenv("POD_TEST_OUT", out)
			podDir := filepath.Join(rootDir, "pods", string(uid))
			mkdirAll(t, filepath.Join(rootDir, "pods"))
			if tt.files != nil {
				tree(t, podDir, tt.files...)
			}
			outBefore := listTree(t, out)
			r, err := rootfs.New(rootDir)
			if err != nil {
				t.Fatal(err)
			}
			req := Request{Root: r, Pod: uid}
			if tt.mountTable != nil {
				req.IsMountPoint = func(p string) bool {
					rel, _ := filepath.Rel(podDir, p)
					return slices.Contains(tt.mountTable, rel)
				}
			}
			err = Remove(t.Context(), req)
			if got := listTree(t, out); !slices.Equal(got, outBefore) {
				t.Errorf("outside the root: %v, was %v", got, outBefore)
			}
			if tt.wantKept == nil {
				if err != nil {
					t.Fatalf("Remove: %v", err)
				}
				if _, err := os.Lstat(podDir); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("pod directory still there (%v): %v", err, listTree(t, podDir))
				}
				return
			}
			got := kept(t, err, podDir)
			for p, want := range tt.wantKept {
				if !errors.Is(got[p], want) {
					t.Errorf("kept %s: %v, want %v", p, got[p], want)
				}
				if !errors.Is(err, want) || !strings.Contains(err.Error(), filepath.Join(podDir, p)) {
					t.Errorf("error %q does not name %s and %v", err, p, want)
				}
			}
			if len(got) != len(tt.wantKept) {
				t.Errorf("kept %v, want %v", got, tt.wantKept)
			}
			var ke *KeptError
			if errors.As(err, &ke); ke.Untouched != tt.untouched {
				t.Errorf("untouched %v, want %v", ke.Untouched, tt.untouched)
			}
			if left := listTree(t, podDir); !slices.Equal(left, tt.wantLeft) {
				t.Errorf("left in the pod directory:\n%q\nwant\n%q", left, tt.wantLeft)
			}
		})
	}
}

// listOf is what tree(names...) makes, as listTree lists it.
func listOf(names []string) []string {
	set := map[string]bool{}
	for _, n := range names {
		n, _, _ = strings.Cut(n, "|")
		n, _, _ = strings.Cut(n, "->")
		for d := filepath.Dir(strings.TrimSuffix(n, "/")); d != "."; d = filepath.Dir(d) {
			set[d+"/"] = true
		}
		set[n] = true
	}
	var out []string
	for n := range set {
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b string) int { return strings.Compare(strings.TrimSuffix(a, "/"), strings.TrimSuffix(b, "/")) })
	return out
}

// TestRemovePodDirSymlink: a symlink in the place of the pod directory is
// removed as a link; what it points to stays.
func TestRemovePodDirSymlink(t *testing.T) {
	base := t.TempDir()
	rootDir, out := filepath.Join(base, "root"), filepath.Join(base, "outside")
	tree(t, out, "volumes/kubernetes.io~empty-dir/x/", "etc-hosts")
	mkdirAll(t, filepath.Join(rootDir, "pods"))
	if err := os.Symlink(out, filepath.Join(rootDir, "pods", string(uid))); err != nil {
		t.Fatal(err)
	}
	r, _ := rootfs.New(rootDir)
	if err := Remove(t.Context(), Request{Root: r, Pod: uid}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(rootDir, "pods", string(uid))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the link stays: %v", err)
	}
	if got := listTree(t, out); len(got) != 4 {
		t.Errorf("what the link pointed to changed: %v", got)
	}
}

// TestRemoveBadUID: a UID that is not one path component is refused.
func TestRemoveBadUID(t *testing.T) {
	r, _ := rootfs.New(t.TempDir())
	for _, bad := range []types.UID{"", "..", "a/b", "."} {
		if err := Remove(t.Context(), Request{Root: r, Pod: bad}); err == nil {
			t.Errorf("UID %q accepted", bad)
		}
	}
}

// TestRemoveRealMounts (root): real mounts below the pod directory (a
// tmpfs, a bind mount of a directory and of a file of the same file
// system, which have the pod directory's device) stop it before anything
// is removed, and the mounts and what is in them stay; a mount on the pod
// directory itself too.
func TestRemoveRealMounts(t *testing.T) {
	roottest.Require(t)
	tests := []struct {
		name  string
		mount func(t *testing.T, podDir, out string) string // the mount point, relative to podDir
	}{
		{"tmpfs in a volume directory", func(t *testing.T, podDir, _ string) string {
			p := "volumes/kubernetes.io~empty-dir/cache"
			mountAt(t, "tmpfs", filepath.Join(podDir, p), "tmpfs", 0)
			tree(t, filepath.Join(podDir, p), "data")
			return p
		}},
		{"bind mount of a directory, same file system", func(t *testing.T, podDir, out string) string {
			p := "volumes/kubernetes.io~csi/pv-1/mount"
			mountAt(t, out, filepath.Join(podDir, p), "", syscall.MS_BIND)
			return p
		}},
		{"bind mount of a file on a subPath target", func(t *testing.T, podDir, out string) string {
			p := "volume-subpaths/cm/app/0"
			tree(t, podDir, p+"|empty")
			mountAt(t, filepath.Join(out, "data"), filepath.Join(podDir, p), "", syscall.MS_BIND)
			return p
		}},
		{"the pod directory itself", func(t *testing.T, podDir, _ string) string {
			mountAt(t, "tmpfs", podDir, "tmpfs", 0)
			tree(t, podDir, "etc-hosts", "volumes/kubernetes.io~csi/pv-1/mount/")
			return "."
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := t.TempDir()
			rootDir, out := filepath.Join(base, "root"), filepath.Join(base, "outside")
			tree(t, out, "data", "sub/file")
			podDir := filepath.Join(rootDir, "pods", string(uid))
			tree(t, podDir, "etc-hosts", "containers/app/1234", "volumes/kubernetes.io~csi/pv-1/mount/",
				"volumes/kubernetes.io~empty-dir/cache/")
			at := tt.mount(t, podDir, out)
			before, outBefore := listTree(t, podDir), listTree(t, out)
			r, _ := rootfs.New(rootDir)
			err := Remove(t.Context(), Request{Root: r, Pod: uid})
			got := kept(t, err, podDir)
			if !errors.Is(got[at], ErrMountPoint) || len(got) != 1 || !errors.Is(err, ErrMountPoint) {
				t.Errorf("kept %v, want %s a mount point", got, at)
			}
			if after := listTree(t, podDir); !slices.Equal(after, before) {
				t.Errorf("the pod directory changed:\n%q\nwas\n%q", after, before)
			}
			if after := listTree(t, out); !slices.Equal(after, outBefore) {
				t.Errorf("outside the root: %q, was %q", after, outBefore)
			}
			if !isMounted(t, filepath.Join(podDir, at)) {
				t.Errorf("%s is no longer mounted", at)
			}
		})
	}
}

// mountAt mounts source at target (made if missing) and unmounts it when
// the test ends.
func mountAt(t *testing.T, source, target, fstype string, flags uintptr) {
	t.Helper()
	if _, err := os.Stat(target); errors.Is(err, os.ErrNotExist) {
		mkdirAll(t, target)
	}
	if err := syscall.Mount(source, target, fstype, flags, ""); err != nil {
		t.Fatalf("mount %s at %s: %v", source, target, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(target, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", target, err)
		}
	})
}

// isMounted reports whether p is in /proc/self/mountinfo.
func isMounted(t *testing.T, p string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == p {
			return true
		}
	}
	return false
}
