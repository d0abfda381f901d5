package local

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/internal/roottest"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// realRoot is a plugin on the real mounter in a temporary root; at the
// end, it checks that nothing is left mounted under the root.
func realRoot(t *testing.T) (*plugin, string) {
	t.Helper()
	roottest.Require(t)
	root := t.TempDir()
	p, err := newPlugin(Config{RootDir: root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if left := mountsUnder(t, root); len(left) > 0 {
			t.Errorf("left mounted: %v", left)
			for i := len(left) - 1; i >= 0; i-- {
				_ = syscall.Unmount(filepath.Join(root, left[i]), syscall.MNT_DETACH)
			}
		}
	})
	return p, root
}

// restart is a new plugin on p's root, as after a restart.
func restart(t *testing.T, root string) *plugin {
	t.Helper()
	p, err := newPlugin(Config{RootDir: root})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// mountsUnder lists the mount points under root in /proc/self/mountinfo,
// relative to root, in order.
func mountsUnder(t *testing.T, root string) []string {
	t.Helper()
	infos, err := mount.ParseMountInfo("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mi := range infos {
		if strings.HasPrefix(mi.MountPoint, root+"/") {
			out = append(out, strings.TrimPrefix(mi.MountPoint, root+"/"))
		}
	}
	sort.Strings(out)
	return out
}

// mountPoints is the mount table as a Recovery's MountPoints.
func mountPoints(t *testing.T) map[string]bool {
	t.Helper()
	infos, err := mount.ParseMountInfo("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]bool{}
	for _, mi := range infos {
		m[mi.MountPoint] = true
	}
	return m
}

// tree lists what is under root, relative, directories with a slash and
// symlinks with their target.
func tree(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.Walk(root, func(path string, fi os.FileInfo, err error) error {
		if err != nil || path == root {
			return err
		}
		rel := strings.TrimPrefix(path, root+"/")
		switch {
		case fi.IsDir():
			rel += "/"
		case fi.Mode()&os.ModeSymlink != 0:
			target, _ := os.Readlink(path)
			rel += " -> " + target
		}
		out = append(out, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// tearDownFound tears down, as the volume manager would for gone pods,
// what a restarted plugin found.
func tearDownFound(t *testing.T, p *plugin, found volume.Found) {
	t.Helper()
	ctx := context.Background()
	for _, m := range found.Mounts {
		if err := p.TearDown(ctx, volume.MountRequest{Spec: &m.Spec, Volume: m.Volume}); err != nil {
			t.Errorf("TearDown of %s: %v", m.Path, err)
		}
	}
	for _, d := range found.Devices {
		if err := p.UnmountDevice(ctx, volume.DeviceRequest{Spec: &d.Spec, DeviceMountPath: d.Path}); err != nil {
			t.Errorf("UnmountDevice of %s: %v", d.Path, err)
		}
	}
}

// TestRootDirectory: a directory PV bind-mounted for two pods (one
// read-only), found Mounted after a restart and torn down from there; the
// data stays in the PV's directory.
func TestRootDirectory(t *testing.T) {
	p, root := realRoot(t)
	ctx := context.Background()
	src := filepath.Join(t.TempDir(), "vol")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	s := spec("pv1", src, podvol.Filesystem)
	rw, ro := podVol("u1"), podVol("u2")
	ro.ReadOnly = true
	if dmp, err := p.MountDevice(ctx, volume.DeviceRequest{Spec: s, Pod: rw}); err != nil || dmp != "" {
		t.Fatalf("MountDevice = %q, %v; want nothing staged", dmp, err)
	}
	path, err := p.SetUp(ctx, volume.MountRequest{Spec: s, Volume: rw})
	if err != nil {
		t.Fatal(err)
	}
	roPath, err := p.SetUp(ctx, volume.MountRequest{Spec: s, Volume: ro})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(path, "data"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(roPath, "data")); err != nil || string(b) != "kept" {
		t.Errorf("read through the read-only mount: %q, %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(roPath, "other"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Errorf("write through the read-only mount: %v, want EROFS", err)
	}
	want := []string{"pods/u1/volumes/kubernetes.io~local-volume/pv1", "pods/u2/volumes/kubernetes.io~local-volume/pv1"}
	if diff := cmp.Diff(want, mountsUnder(t, root)); diff != "" {
		t.Errorf("mounts (-want +got):\n%s", diff)
	}
	// Idempotent on a real bind mount of the same filesystem.
	if _, err := p.SetUp(ctx, volume.MountRequest{Spec: s, Volume: rw}); err != nil || len(mountsUnder(t, root)) != 2 {
		t.Errorf("second SetUp: %v, mounts %v", err, mountsUnder(t, root))
	}

	p2 := restart(t, root)
	found := p2.Reconstruct(ctx, volume.Recovery{MountPoints: mountPoints(t)})
	if len(found.Mounts) != 2 || found.Mounts[0].State != podvol.Mounted || found.Mounts[1].State != podvol.Mounted || len(found.Devices) != 0 {
		t.Fatalf("Reconstruct = %+v, want both pod mounts Mounted", found)
	}
	tearDownFound(t, p2, found)
	if left := mountsUnder(t, root); len(left) != 0 {
		t.Errorf("left mounted: %v", left)
	}
	wantTree := []string{"pods/", "pods/u1/", "pods/u1/volumes/", "pods/u1/volumes/kubernetes.io~local-volume/",
		"pods/u2/", "pods/u2/volumes/", "pods/u2/volumes/kubernetes.io~local-volume/"}
	if diff := cmp.Diff(wantTree, tree(t, root)); diff != "" {
		t.Errorf("root after teardown (-want +got):\n%s", diff)
	}
	if b, err := os.ReadFile(filepath.Join(src, "data")); err != nil || string(b) != "kept" {
		t.Errorf("the PV's data: %q, %v", b, err)
	}
}

// loopDevice attaches a loop device to a new sparse file of size bytes
// and detaches it at the end.
func loopDevice(t *testing.T, size int64) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "disk.img")
	f, err := os.Create(file)
	if err == nil {
		err = f.Truncate(size)
		f.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", file).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "--detach", dev).CombinedOutput(); err != nil {
			t.Errorf("detaching %s: %v: %s", dev, err, out)
		}
	})
	return dev
}

// loopsOf lists the loop devices attached to file.
func loopsOf(t *testing.T, file string) string {
	t.Helper()
	out, err := exec.Command("losetup", "--associated", file).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup --associated %s: %v: %s", file, err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestRootBlockDeviceFilesystem: a loop device formatted as ext4 and
// mounted once at the kubelet's device mount path, bind-mounted into a
// pod; after a restart both are found Mounted and torn down, the device
// mount last; the data is on the device.
func TestRootBlockDeviceFilesystem(t *testing.T) {
	p, root := realRoot(t)
	ctx := context.Background()
	dev := loopDevice(t, 64<<20)
	s := spec("pv1", dev, podvol.Filesystem)
	vol := podVol("u1")
	dmp, err := p.MountDevice(ctx, volume.DeviceRequest{Spec: s, Pod: vol})
	if err != nil {
		t.Fatal(err)
	}
	path, err := p.SetUp(ctx, volume.MountRequest{Spec: s, Volume: vol, DeviceMountPath: dmp})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(path, "data"), []byte("on the device"), 0o644); err != nil {
		t.Fatal(err)
	}
	want := []string{"plugins/kubernetes.io/local-volume/mounts/pv1", "pods/u1/volumes/kubernetes.io~local-volume/pv1"}
	if diff := cmp.Diff(want, mountsUnder(t, root)); diff != "" {
		t.Errorf("mounts (-want +got):\n%s", diff)
	}
	if out, err := exec.Command("blkid", "-o", "value", "-s", "TYPE", dev).Output(); err != nil || strings.TrimSpace(string(out)) != "ext4" {
		t.Errorf("blkid %s: %q, %v; want ext4", dev, out, err)
	}
	if st, ok, err := p.VolumeStats(ctx, s, path, dmp); err != nil || !ok || st.CapacityBytes <= 0 || st.UsedBytes <= 0 || st.Inodes <= 0 {
		t.Errorf("VolumeStats = %+v, %v, %v", st, ok, err)
	}
	var inUse *volume.InUseError
	if err := p.UnmountDevice(ctx, volume.DeviceRequest{Spec: s, DeviceMountPath: dmp}); !errors.As(err, &inUse) || len(inUse.Refs) != 1 || inUse.Refs[0] != path {
		t.Fatalf("UnmountDevice under the pod's mount = %v, want an InUseError naming %s", err, path)
	}

	p2 := restart(t, root)
	found := p2.Reconstruct(ctx, volume.Recovery{MountPoints: mountPoints(t)})
	if len(found.Mounts) != 1 || found.Mounts[0].State != podvol.Mounted || len(found.Devices) != 1 || found.Devices[0].State != podvol.Mounted ||
		found.Devices[0].Path != dmp || found.Devices[0].Spec.Name != "kubernetes.io/local-volume/pv1" {
		t.Fatalf("Reconstruct = %+v, want the pod mount and the device mount, Mounted", found)
	}
	tearDownFound(t, p2, found)
	if left := mountsUnder(t, root); len(left) != 0 {
		t.Errorf("left mounted: %v", left)
	}
	wantTree := []string{"plugins/", "plugins/kubernetes.io/", "plugins/kubernetes.io/local-volume/", "plugins/kubernetes.io/local-volume/mounts/",
		"pods/", "pods/u1/", "pods/u1/volumes/", "pods/u1/volumes/kubernetes.io~local-volume/"}
	if diff := cmp.Diff(wantTree, tree(t, root)); diff != "" {
		t.Errorf("root after teardown (-want +got):\n%s", diff)
	}
	// Mounted again, the device keeps its filesystem and the data.
	dmp, err = p2.MountDevice(ctx, volume.DeviceRequest{Spec: s, Pod: vol})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dmp, "data")); err != nil || string(b) != "on the device" {
		t.Errorf("data after a second MountDevice: %q, %v", b, err)
	}
	if err := p2.UnmountDevice(ctx, volume.DeviceRequest{Spec: s}); err != nil {
		t.Fatal(err)
	}
}

// TestRootBlock: a Block PV's loop device mapped into two pods in the
// kubelet's layout, each map file bind-mounted and held by a loop device;
// after a restart the mappings are found and unmapped, and no loop device
// holds a map file any more.
func TestRootBlock(t *testing.T) {
	p, root := realRoot(t)
	ctx := context.Background()
	dev := loopDevice(t, 16<<20)
	s := spec("pv1", dev, podvol.Block)
	for _, uid := range []string{"u1", "u2"} {
		link, err := p.SetUp(ctx, volume.MountRequest{Spec: s, Volume: podVol(uid)})
		if err != nil {
			t.Fatal(err)
		}
		if target, err := os.Readlink(link); err != nil || target != dev {
			t.Errorf("%s -> %q, %v; want %s", link, target, err, dev)
		}
		if loops := loopsOf(t, filepath.Join(root, "plugins/kubernetes.io~local-volume/volumeDevices/pv1", uid)); loops == "" {
			t.Errorf("no loop device holds the map file of pod %s", uid)
		}
	}
	want := []string{"plugins/kubernetes.io~local-volume/volumeDevices/pv1/u1", "plugins/kubernetes.io~local-volume/volumeDevices/pv1/u2"}
	if diff := cmp.Diff(want, mountsUnder(t, root)); diff != "" {
		t.Errorf("mounts (-want +got):\n%s", diff)
	}
	if st, ok, err := p.VolumeStats(ctx, s, filepath.Join(root, "pods/u1/volumeDevices/kubernetes.io~local-volume/pv1"), ""); err != nil || !ok || st.CapacityBytes != 16<<20 {
		t.Errorf("VolumeStats = %+v, %v, %v; want a capacity of 16 MiB", st, ok, err)
	}

	p2 := restart(t, root)
	found := p2.Reconstruct(ctx, volume.Recovery{MountPoints: mountPoints(t)})
	if len(found.Mounts) != 2 || len(found.Devices) != 1 || found.Devices[0].Spec.Mode != podvol.Block {
		t.Fatalf("Reconstruct = %+v, want two Block mappings and the volume's device", found)
	}
	tearDownFound(t, p2, found)
	if left := mountsUnder(t, root); len(left) != 0 {
		t.Errorf("left mounted: %v", left)
	}
	wantTree := []string{"plugins/", "plugins/kubernetes.io~local-volume/", "plugins/kubernetes.io~local-volume/volumeDevices/",
		"pods/", "pods/u1/", "pods/u1/volumeDevices/", "pods/u2/", "pods/u2/volumeDevices/"}
	if diff := cmp.Diff(wantTree, tree(t, root)); diff != "" {
		t.Errorf("root after teardown (-want +got):\n%s", diff)
	}
	out, err := exec.Command("losetup", "--list", "--noheadings", "--output", "BACK-FILE").Output()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), root) {
		t.Errorf("loop devices still hold files under the root:\n%s", out)
	}
}
