package blockdev

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"k8s.io/mount-utils"
)

// calls records the order of system calls across the fakes.
type calls struct{ log []string }

type fakeLoop struct {
	c       *calls
	devices map[string]string // path -> loop device
	next    int
}

func (f *fakeLoop) Attach(_ context.Context, path string) (string, error) {
	f.next++
	dev := "/dev/loop" + string(rune('0'+f.next))
	f.devices[path] = dev
	f.c.log = append(f.c.log, "attach "+filepath.Base(path))
	return dev, nil
}

func (f *fakeLoop) Find(_ context.Context, path string) (string, error) { return f.devices[path], nil }

func (f *fakeLoop) Detach(_ context.Context, dev string) error {
	for p, d := range f.devices {
		if d == dev {
			delete(f.devices, p)
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
