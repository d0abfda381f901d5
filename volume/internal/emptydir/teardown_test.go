package emptydir

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/step"
	"github.com/nodevol/nodevol/volume"
)

func TestTearDown(t *testing.T) {
	tests := []struct {
		name   string
		medium v1.StorageMedium
		// fill puts content in the volume directory dir; outside is a
		// directory outside the volume.
		fill func(t *testing.T, dir, outside string)
	}{
		{name: "disk, empty"},
		{name: "memory", medium: "Memory"},
		{name: "disk with a tree", fill: func(t *testing.T, dir, _ string) {
			write(t, filepath.Join(dir, "a/b/c/file"), "data")
			write(t, filepath.Join(dir, "top"), "x")
			if err := syscall.Mkfifo(filepath.Join(dir, "a/fifo"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(filepath.Join(dir, "a/b"), 0o500); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "symlinks to outside", fill: func(t *testing.T, dir, outside string) {
			if err := os.Symlink(outside, filepath.Join(dir, "link")); err != nil {
				t.Fatal(err)
			}
			write(t, filepath.Join(dir, "d/x"), "x")
			if err := os.Symlink(filepath.Join(outside, "keep"), filepath.Join(dir, "d/filelink")); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tp := newTestPlugin(t, nil)
			outside := t.TempDir()
			write(t, filepath.Join(outside, "keep"), "keep")
			spec := tp.spec(t, testPod(ctr(nil, nil)), "v", v1.EmptyDirVolumeSource{Medium: tt.medium})
			dir, err := tp.SetUp(context.Background(), request(spec, "v"))
			if err != nil {
				t.Fatal(err)
			}
			if tt.fill != nil {
				tt.fill(t, dir, outside)
			}
			// From the path alone: no source.
			req := request(&cacheSpecWithoutSource, "v")
			for i := range 2 {
				if err := tp.TearDown(context.Background(), req); err != nil {
					t.Fatalf("TearDown %d: %v", i+1, err)
				}
			}
			if exists(t, dir) || exists(t, filepath.Dir(tp.readyPath("v"))) {
				t.Error("the volume directory or the ready directory is left")
			}
			if len(tp.fake.MountPoints) != 0 {
				t.Errorf("left mounted: %v", tp.fake.MountPoints)
			}
			if b, err := os.ReadFile(filepath.Join(outside, "keep")); err != nil || string(b) != "keep" {
				t.Errorf("a symlink's target was touched: %q, %v", b, err)
			}
		})
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestTearDownRefusesOtherMounts(t *testing.T) {
	tests := []struct {
		name   string
		mounts func(dir string) []mount.MountPoint
		want   string
	}{
		{name: "a mount below", want: "/sub: another file system is mounted there",
			mounts: func(dir string) []mount.MountPoint {
				return []mount.MountPoint{{Device: "/dev/sdb", Path: dir + "/sub", Type: "ext4"}}
			}},
		{name: "another file system at the directory", want: "(ext4): another file system is mounted there",
			mounts: func(dir string) []mount.MountPoint {
				return []mount.MountPoint{{Device: "/dev/sdb", Path: dir, Type: "ext4"}}
			}},
		{name: "a tmpfs over another file system", want: "(ext4): another file system is mounted there",
			mounts: func(dir string) []mount.MountPoint {
				return []mount.MountPoint{{Device: "/dev/sdb", Path: dir, Type: "ext4"}, {Device: "tmpfs", Path: dir, Type: "tmpfs"}}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tp := newTestPlugin(t, nil)
			spec := tp.spec(t, testPod(ctr(nil, nil)), "v", v1.EmptyDirVolumeSource{})
			dir, err := tp.SetUp(context.Background(), request(spec, "v"))
			if err != nil {
				t.Fatal(err)
			}
			write(t, filepath.Join(dir, "sub/data"), "data")
			tp.fake.MountPoints = tt.mounts(dir)
			tp.steps = nil
			err = tp.TearDown(context.Background(), request(spec, "v"))
			if err == nil || !errors.Is(err, errOtherMount) || !strings.Contains(err.Error(), tt.want) || volume.IsUncertain(err) {
				t.Fatalf("TearDown: %v, want a refusal saying %q", err, tt.want)
			}
			if len(tp.steps) != 0 || !exists(t, filepath.Join(dir, "sub/data")) || !exists(t, tp.readyPath("v")) {
				t.Errorf("the refusal changed something: steps %v", tp.steps)
			}
		})
	}
}

func TestTearDownHalfDone(t *testing.T) {
	tp := newTestPlugin(t, nil)
	spec := tp.spec(t, testPod(ctr(nil, nil)), "v", v1.EmptyDirVolumeSource{Medium: "Memory"})
	dir, err := tp.SetUp(context.Background(), request(spec, "v"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := newPlugin(Config{RootDir: tp.root, Mounter: tp.fake, Steps: func(s step.Step) error {
		if s.Op == step.Unmount {
			return errors.New("refused")
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.TearDown(context.Background(), request(spec, "v")); !volume.IsUncertain(err) {
		t.Errorf("TearDown with the unmount refused: %v, want Uncertain", err)
	}
	if err := tp.TearDown(context.Background(), request(spec, "v")); err != nil || exists(t, dir) || len(tp.fake.MountPoints) != 0 {
		t.Errorf("TearDown again: %v; left %v", err, tp.fake.MountPoints)
	}
}

func TestTearDownNotADirectory(t *testing.T) {
	tp := newTestPlugin(t, nil)
	outside := t.TempDir()
	dir := tp.volumeDir("v")
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, dir); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(outside, "keep"), "keep")
	if err := tp.TearDown(context.Background(), request(&cacheSpecWithoutSource, "v")); err != nil {
		t.Fatal(err)
	}
	if exists(t, dir) || !exists(t, filepath.Join(outside, "keep")) {
		t.Error("the symlink in the volume's place is left, or its target's content is gone")
	}
}

// listCounter counts the mount table reads of the mounter it wraps.
type listCounter struct {
	mount.Interface
	lists int
}

func (c *listCounter) List() ([]mount.MountPoint, error) {
	c.lists++
	return c.Interface.List()
}

// TestMountTableReads: the node's mount table, which grows with its pods,
// is read only where a volume's directory is a mount point and its type
// matters: never for a volume on disk, nor to set a memory volume up or
// to find it set up (mounted at all is enough); once to tear one down
// whose directory is no mount's root, as a fake mounter's mounts are not
// (a real tmpfs is known from its directory: TestRootTearDownWithoutTable). On
// a kernel that does not say which directories are mount roots, it is read
// as before the statx: at each check of a memory volume and once per tear
// down.
func TestMountTableReads(t *testing.T) {
	tests := []struct {
		name                   string
		medium                 v1.StorageMedium
		rootsUnknown           bool
		setUp, again, tearDown int
	}{
		{name: "disk"},
		{name: "memory", medium: "Memory", tearDown: 1},
		{name: "disk, mount roots unknown", rootsUnknown: true, tearDown: 1},
		{name: "memory, mount roots unknown", medium: "Memory", rootsUnknown: true, setUp: 1, again: 1, tearDown: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tp := newTestPlugin(t, nil)
			c := &listCounter{Interface: tp.fake}
			tp.mounter = c
			tp.mountRootsKnown = func() bool { return !tt.rootsUnknown }
			spec := tp.spec(t, testPod(ctr(nil, nil)), "v", v1.EmptyDirVolumeSource{Medium: tt.medium})
			dir, err := tp.SetUp(context.Background(), request(spec, "v"))
			if err != nil {
				t.Fatal(err)
			}
			write(t, filepath.Join(dir, "a/b/data"), "data")
			got := []int{c.lists}
			if _, err := tp.SetUp(context.Background(), request(spec, "v")); err != nil {
				t.Fatal(err)
			}
			got = append(got, c.lists-got[0])
			if err := tp.TearDown(context.Background(), request(spec, "v")); err != nil {
				t.Fatal(err)
			}
			got = append(got, c.lists-got[0]-got[1])
			if want := []int{tt.setUp, tt.again, tt.tearDown}; !slices.Equal(got, want) {
				t.Errorf("mount table reads by SetUp, SetUp again, TearDown: %v, want %v", got, want)
			}
			if exists(t, dir) || len(tp.fake.MountPoints) != 0 {
				t.Errorf("TearDown left %s or mounts %v", dir, tp.fake.MountPoints)
			}
		})
	}
}

// TestMountRootsKnown: the kernel says which directories are mount roots
// from Linux 5.8 on.
func TestMountRootsKnown(t *testing.T) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	release := unix.ByteSliceToString(u.Release[:])
	if want := kernelAtLeast(release, 5, 8); mountRootsKnown() != want {
		t.Errorf("mountRootsKnown() = %v on Linux %s, want %v", !want, release, want)
	}
}
