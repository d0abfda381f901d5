package blockdev

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

	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/internal/rootfs"
)

// calls records the order of system calls across the fakes.
type calls struct{ log []string }

type fakeLoop struct {
	c       *calls
	devices map[string]string // path -> loop device
	next    int
	// linger is how many Finds still see a detached device on its file,
	// as a loop device detached while something has it open holds its
	// backing file until the last opener closes it.
	linger int
}

func (f *fakeLoop) Attach(_ context.Context, path string) (string, error) {
	f.next++
	dev := "/dev/loop" + string(rune('0'+f.next))
	f.devices[path] = dev
	f.c.log = append(f.c.log, "attach "+filepath.Base(path))
	return dev, nil
}

func (f *fakeLoop) Find(_ context.Context, path string) (string, error) {
	dev := f.devices[path]
	if f.detached(dev) {
		if f.linger == 0 {
			delete(f.devices, path)
			return "", nil
		}
		f.linger--
	}
	return dev, nil
}

// detached reports whether dev was detached (and lingers).
func (f *fakeLoop) detached(dev string) bool {
	return slices.Contains(f.c.log, "detach "+dev)
}

func (f *fakeLoop) Detach(_ context.Context, dev string) error {
	if f.linger == 0 {
		for p, d := range f.devices {
			if d == dev {
				delete(f.devices, p)
			}
		}
	}
	f.c.log = append(f.c.log, "detach "+dev)
	return nil
}

type recordingMounter struct {
	*mount.FakeMounter
	c *calls
}

func (r recordingMounter) Mount(source, target, fstype string, options []string) error {
	r.c.log = append(r.c.log, "bind "+filepath.Base(target))
	return r.FakeMounter.Mount(source, target, fstype, options)
}

func (r recordingMounter) Unmount(target string) error {
	r.c.log = append(r.c.log, "unmount "+filepath.Base(target))
	return r.FakeMounter.Unmount(target)
}

type fixture struct {
	c     *calls
	loop  *fakeLoop
	mp    *Mapper
	m     Map
	block bool
}

func newFixture(t *testing.T) *fixture {
	root := t.TempDir()
	dev := filepath.Join(root, "publish", "pv-1", "uid-1")
	if err := os.MkdirAll(filepath.Dir(dev), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dev, nil, 0o640); err != nil {
		t.Fatal(err)
	}
	f := &fixture{c: &calls{}, block: true}
	f.loop = &fakeLoop{c: f.c, devices: map[string]string{}}
	f.mp = &Mapper{
		Mounter:       recordingMounter{FakeMounter: mount.NewFakeMounter(nil), c: f.c},
		Loop:          f.loop,
		IsBlockDevice: func(string) (bool, error) { return f.block, nil },
	}
	f.m = Map{
		DevicePath:    dev,
		GlobalMapPath: filepath.Join(root, "pv-1", "dev"),
		PodUID:        "uid-1",
		PodDeviceDir:  filepath.Join(root, "pods", "uid-1", "volumeDevices", "kubernetes.io~csi"),
		Name:          "pv-1",
	}
	return f
}

func exists(p string) bool { _, err := os.Lstat(p); return err == nil }

func TestMapAndUnmap(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if err := f.mp.Map(ctx, f.m); err != nil {
		t.Fatal(err)
	}
	if want := []string{"bind uid-1", "attach uid-1"}; !slices.Equal(f.c.log, want) {
		t.Errorf("Map calls %v, want %v", f.c.log, want)
	}
	if target, err := os.Readlink(f.m.link()); err != nil || target != f.m.DevicePath {
		t.Errorf("pod symlink -> %q, %v; want %s", target, err, f.m.DevicePath)
	}
	// Again: nothing new.
	if err := f.mp.Map(ctx, f.m); err != nil {
		t.Fatal(err)
	}
	if len(f.c.log) != 2 {
		t.Errorf("second Map made calls: %v", f.c.log[2:])
	}

	f.c.log = nil
	if err := f.mp.Unmap(ctx, f.m); err != nil {
		t.Fatal(err)
	}
	if want := []string{"detach /dev/loop1", "unmount uid-1"}; !slices.Equal(f.c.log, want) {
		t.Errorf("Unmap calls %v, want %v", f.c.log, want)
	}
	for _, p := range []string{f.m.link(), f.m.mapFile(), f.m.GlobalMapPath, f.m.PodDeviceDir} {
		if exists(p) {
			t.Errorf("%s left after Unmap", p)
		}
	}
	if !exists(f.m.DevicePath) {
		t.Errorf("Unmap removed the driver's %s", f.m.DevicePath)
	}
	// Again: nothing to do.
	f.c.log = nil
	if err := f.mp.Unmap(ctx, f.m); err != nil || len(f.c.log) != 0 {
		t.Errorf("second Unmap = %v with calls %v, want nil and none", err, f.c.log)
	}
}

// busyMounter fails to unmount a map file a loop device still holds, as
// umount(8) does ("target is busy").
type busyMounter struct {
	recordingMounter
	loop *fakeLoop
}

func (b busyMounter) Unmount(target string) error {
	if dev, _ := b.loop.Find(context.Background(), target); dev != "" {
		b.c.log = append(b.c.log, "unmount "+filepath.Base(target)+": busy")
		return fmt.Errorf("umount: %s: target is busy", target)
	}
	return b.recordingMounter.Unmount(target)
}

// TestUnmapWaitsForTheLoopDevice: a loop device detached while something
// has it open (udev probing it) holds the map file until it is released;
// Unmap unmounts the map file only then, so the unmount does not fail.
func TestUnmapWaitsForTheLoopDevice(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.mp.Mounter = busyMounter{recordingMounter: f.mp.Mounter.(recordingMounter), loop: f.loop}
	if err := f.mp.Map(ctx, f.m); err != nil {
		t.Fatal(err)
	}
	f.c.log, f.loop.linger = nil, 3
	if err := f.mp.Unmap(ctx, f.m); err != nil {
		t.Fatal(err)
	}
	if want := []string{"detach /dev/loop1", "unmount uid-1"}; !slices.Equal(f.c.log, want) {
		t.Errorf("Unmap calls %v, want %v", f.c.log, want)
	}
	if f.loop.linger != 0 {
		t.Errorf("Unmap did not wait for the loop device: %d Finds would still have seen it", f.loop.linger)
	}
	for _, p := range []string{f.m.mapFile(), f.m.GlobalMapPath} {
		if exists(p) {
			t.Errorf("%s left after Unmap", p)
		}
	}
}

func TestMapBadInput(t *testing.T) {
	ctx := context.Background()
	t.Run("not a block device", func(t *testing.T) {
		f := newFixture(t)
		f.block = false
		if err := f.mp.Map(ctx, f.m); err == nil {
			t.Fatal("Map of a non-block device succeeded")
		}
		if len(f.c.log) != 0 || exists(f.m.GlobalMapPath) || exists(f.m.link()) {
			t.Errorf("a refused Map left calls %v or files", f.c.log)
		}
	})
	t.Run("symlink points elsewhere", func(t *testing.T) {
		f := newFixture(t)
		if err := os.MkdirAll(f.m.PodDeviceDir, 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("/dev/other", f.m.link()); err != nil {
			t.Fatal(err)
		}
		if err := f.mp.Map(ctx, f.m); err == nil {
			t.Error("Map over a foreign symlink succeeded")
		}
		f.c.log = nil
		if err := f.mp.Unmap(ctx, f.m); err == nil {
			t.Error("Unmap of a foreign symlink succeeded")
		}
		if target, _ := os.Readlink(f.m.link()); target != "/dev/other" {
			t.Errorf("the foreign symlink now points to %q", target)
		}
		if len(f.c.log) != 0 {
			t.Errorf("Unmap went on after refusing the symlink: %v", f.c.log)
		}
	})
	t.Run("loop device already gone", func(t *testing.T) {
		f := newFixture(t)
		if err := f.mp.Map(ctx, f.m); err != nil {
			t.Fatal(err)
		}
		f.loop.devices = map[string]string{}
		f.c.log = nil
		if err := f.mp.Unmap(ctx, f.m); err != nil {
			t.Fatal(err)
		}
		if want := []string{"unmount uid-1"}; !slices.Equal(f.c.log, want) {
			t.Errorf("Unmap calls %v, want %v", f.c.log, want)
		}
	})
	t.Run("global map path missing", func(t *testing.T) {
		f := newFixture(t)
		if err := f.mp.Unmap(ctx, f.m); err != nil || len(f.c.log) != 0 {
			t.Errorf("Unmap of nothing = %v, calls %v", err, f.c.log)
		}
	})
}

// confined returns a fixture whose Mapper is confined to the fixture's
// root directory.
func confined(t *testing.T) (*fixture, string) {
	t.Helper()
	f := newFixture(t)
	root := filepath.Dir(filepath.Dir(filepath.Dir(f.m.DevicePath))) // {root}/publish/pv-1/uid-1
	r, err := rootfs.New(root)
	if err != nil {
		t.Fatal(err)
	}
	f.mp.Root = r
	return f, root
}

func TestMapAndUnmapConfined(t *testing.T) {
	f, _ := confined(t)
	ctx := context.Background()
	if err := f.mp.Map(ctx, f.m); err != nil {
		t.Fatal(err)
	}
	if target, err := os.Readlink(f.m.link()); err != nil || target != f.m.DevicePath {
		t.Errorf("pod symlink -> %q, %v; want %s", target, err, f.m.DevicePath)
	}
	if err := f.mp.Map(ctx, f.m); err != nil {
		t.Fatal(err)
	}
	if err := f.mp.Unmap(ctx, f.m); err != nil {
		t.Fatal(err)
	}
	if want := []string{"bind uid-1", "attach uid-1", "detach /dev/loop1", "unmount uid-1"}; !slices.Equal(f.c.log, want) {
		t.Errorf("calls %v, want %v", f.c.log, want)
	}
	for _, p := range []string{f.m.link(), f.m.mapFile(), f.m.GlobalMapPath, f.m.PodDeviceDir} {
		if exists(p) {
			t.Errorf("%s left after Unmap", p)
		}
	}
	if err := f.mp.Unmap(ctx, f.m); err != nil {
		t.Errorf("second Unmap: %v", err)
	}
	outside := Map{DevicePath: "/dev/sda", GlobalMapPath: "/tmp/x", PodUID: "u", PodDeviceDir: "/tmp/y", Name: "n"}
	if err := f.mp.Map(ctx, outside); !errors.Is(err, rootfs.ErrOutside) {
		t.Errorf("Map of paths outside the root = %v, want ErrOutside", err)
	}
}

// TestMapDeviceOutsideRoot: a confined Mapper maps a device outside the
// root (a local PV's disk): the device is only a mount source and a
// symlink target; every path it makes stays under the root.
func TestMapDeviceOutsideRoot(t *testing.T) {
	f, root := confined(t)
	dev := filepath.Join(t.TempDir(), "disk") // outside the root
	if err := os.Rename(f.m.DevicePath, dev); err != nil {
		t.Fatal(err)
	}
	f.m.DevicePath = dev
	if _, err := f.mp.Root.Rel(dev); !errors.Is(err, rootfs.ErrOutside) {
		t.Fatalf("the device %s is under the root %s", dev, root)
	}
	ctx := context.Background()
	if err := f.mp.Map(ctx, f.m); err != nil {
		t.Fatalf("Map of a device outside the root: %v", err)
	}
	if target, err := os.Readlink(f.m.link()); err != nil || target != dev {
		t.Errorf("pod symlink -> %q, %v; want %s", target, err, dev)
	}
	if err := f.mp.Unmap(ctx, f.m); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dev); err != nil {
		t.Errorf("the device after Unmap: %v", err)
	}
}

// TestMapRefusesSymlinks: with a Root, a symlink as any directory of a
// Map refuses Map and Unmap before anything is mounted, attached, created
// or removed, and the directory it points to is untouched.
func TestMapRefusesSymlinks(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		name  string
		link  func(m Map) string
		unmap bool
	}{
		{"pod device directory", func(m Map) string { return m.PodDeviceDir }, false},
		{"pod directory", func(m Map) string { return filepath.Dir(filepath.Dir(m.PodDeviceDir)) }, false},
		{"global map path", func(m Map) string { return m.GlobalMapPath }, false},
		{"volume directory", func(m Map) string { return filepath.Dir(m.GlobalMapPath) }, false},
		{"device path", func(m Map) string { return m.DevicePath }, false},
		{"pod device directory on unmap", func(m Map) string { return m.PodDeviceDir }, true},
		{"global map path on unmap", func(m Map) string { return m.GlobalMapPath }, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f, _ := confined(t)
			out := t.TempDir()
			// What a mapped pod would have there.
			if err := os.Symlink(f.m.DevicePath, filepath.Join(out, f.m.Name)); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(out, f.m.PodUID), nil, 0o640); err != nil {
				t.Fatal(err)
			}
			link := tt.link(f.m)
			if err := os.RemoveAll(link); err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(filepath.Dir(link), 0o750); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(out, link); err != nil {
				t.Fatal(err)
			}
			var err error
			if tt.unmap {
				err = f.mp.Unmap(ctx, f.m)
			} else {
				err = f.mp.Map(ctx, f.m)
			}
			if !errors.Is(err, rootfs.ErrSymlink) || !strings.Contains(err.Error(), link+" is a symlink") {
				t.Errorf("error %v, want %s refused as a symlink", err, link)
			}
			if len(f.c.log) != 0 {
				t.Errorf("calls %v, want none", f.c.log)
			}
			entries, _ := os.ReadDir(out)
			if len(entries) != 2 {
				t.Errorf("the outside directory holds %v, want only what was there", entries)
			}
			if fi, err := os.Lstat(link); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
				t.Errorf("the symlink %s is gone: %v", link, err)
			}
		})
	}
}

func TestCleanupMountPointConfined(t *testing.T) {
	root := t.TempDir()
	r, err := rootfs.New(root)
	if err != nil {
		t.Fatal(err)
	}
	m := mount.NewFakeMounter(nil)
	out := t.TempDir()
	if err := os.WriteFile(filepath.Join(out, "file"), nil, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(out, "file"), filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	if err := CleanupMountPoint(r, m, filepath.Join(root, "link")); !errors.Is(err, rootfs.ErrSymlink) {
		t.Errorf("CleanupMountPoint of a symlink = %v, want ErrSymlink", err)
	}
	if !exists(filepath.Join(root, "link")) || !exists(filepath.Join(out, "file")) {
		t.Error("the symlink or its target was removed")
	}
	file := filepath.Join(root, "file")
	if err := os.WriteFile(file, nil, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := m.Mount("/dev/sda", file, "", []string{"bind"}); err != nil {
		t.Fatal(err)
	}
	if err := CleanupMountPoint(r, m, file); err != nil {
		t.Fatal(err)
	}
	if exists(file) {
		t.Error("the unmounted file is still there")
	}
	if err := CleanupMountPoint(r, m, filepath.Join(root, "missing")); err != nil {
		t.Errorf("CleanupMountPoint of a missing path: %v", err)
	}
}
