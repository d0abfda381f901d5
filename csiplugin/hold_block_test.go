package csiplugin

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/internal/blockdev"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/step"
	"github.com/nodevol/nodevol/volume"
)

// The raw block paths of blockSpec for pod uid-a, relative to the root.
const (
	blockDevices     = "plugins/kubernetes.io/csi/volumeDevices"
	blockStaging     = blockDevices + "/staging/pv-1"
	blockPublishPath = blockDevices + "/publish/pv-1/uid-a"
	blockMapFile     = blockDevices + "/pv-1/dev/uid-a"
	blockData        = blockDevices + "/pv-1/data/" + ondisk.VolumeDataFile
	blockPodDevice   = "pods/uid-a/volumeDevices/kubernetes.io~csi/pv-1"
)

// tableMounter answers mount checks from the fake mounter's table alone,
// without looking at the path: a mounter works by path, as a driver does,
// and sees what the root's path names now, not the directory an operation
// holds. The tests of the held root check the plugin's own file work with
// it; whether a path is a mount point is the mount table's answer.
type tableMounter struct{ *mount.FakeMounter }

func (m tableMounter) IsLikelyNotMountPoint(path string) (bool, error) {
	mnt, err := m.IsMountPoint(path)
	return !mnt, err
}

func (m tableMounter) IsMountPoint(path string) (bool, error) {
	mps, err := m.List()
	for _, mp := range mps {
		if mp.Path == path {
			return true, err
		}
	}
	return false, err
}

// heldBlockEnv is an env whose plugin maps block volumes with its default
// mapper (fake loop devices), with a driver that creates no file: all the
// root holds is the plugin's work. Its root exists, so that operations
// hold it.
func heldBlockEnv(t *testing.T) *env {
	t.Helper()
	e := newEnv(t, envOptions{})
	m, ok := e.p.blockMapper.(*blockdev.Mapper)
	if !ok {
		t.Fatalf("the default block mapper is a %T", e.p.blockMapper)
	}
	m.Loop = &fakeLooper{dev: map[string]string{}}
	m.IsBlockDevice = func(string) (bool, error) { return true, nil }
	if err := os.MkdirAll(e.root, 0o750); err != nil {
		t.Fatal(err)
	}
	return e
}

// blockOp is one raw block operation of the held-root tests: what runs
// before it (unswapped), and the operation itself.
type blockOp struct {
	name   string
	before []string // "stage", "publish", in order
	method string   // the driver call the operation makes
	run    func(e *env) error
}

var blockOps = map[string]blockOp{
	"stage": {"stage", nil, "NodeStageVolume", func(e *env) error {
		_, err := e.p.MountDevice(context.Background(), volume.DeviceRequest{Spec: blockSpec()})
		return err
	}},
	"publish": {"publish", []string{"stage"}, "NodePublishVolume", func(e *env) error {
		_, err := e.p.SetUp(context.Background(), blockRequest(e))
		return err
	}},
	"unpublish": {"unpublish", []string{"stage", "publish"}, "NodeUnpublishVolume", func(e *env) error {
		return e.p.TearDown(context.Background(), blockRequest(e))
	}},
	"unstage": {"unstage", []string{"stage"}, "NodeUnstageVolume", func(e *env) error {
		return e.p.UnmountDevice(context.Background(), volume.DeviceRequest{Spec: blockSpec()})
	}},
}

// blockRequest is the pod request of blockSpec for pod uid-a.
func blockRequest(e *env) volume.MountRequest {
	return volume.MountRequest{Spec: blockSpec(), Volume: podVolume("a", "data"),
		DeviceMountPath: filepath.Join(e.root, blockStaging)}
}

// setUp runs what op needs done first, on the root as it is.
func (op blockOp) setUp(t *testing.T, e *env) {
	t.Helper()
	for _, b := range op.before {
		if err := blockOps[b].run(e); err != nil {
			t.Fatalf("%s before %s: %v", b, op.name, err)
		}
	}
	e.srv.Reset()
}

// onFirstChange makes fn run once, right before the first change the
// plugin's root (and so its records and its default mapper) makes.
func onFirstChange(e *env, fn func() error) {
	var once sync.Once
	e.p.rfs = e.p.rfs.WithSteps(func(step.Step) error {
		var err error
		once.Do(func() { err = fn() })
		return err
	})
}

// TestBlockOperationHoldsTheRoot: each raw block operation resolves all its
// paths, its records and its mapper's from the root directory as it was
// when it started: when another directory takes the root's path right
// before its first change, everything it writes and removes is in the
// directory it started with, nothing in the new one.
func TestBlockOperationHoldsTheRoot(t *testing.T) {
	for _, tc := range []struct {
		op      string
		there   []string // in the old root afterwards
		notHere []string // gone from the old root afterwards
	}{
		{"stage", []string{blockData, blockStaging, ondisk.RecordFile(blockStaging)}, nil},
		{"publish", []string{blockPodDevice, blockMapFile, ondisk.RecordFile(blockPublishPath)}, nil},
		{"unpublish", []string{blockStaging}, []string{blockPodDevice, blockMapFile, blockDevices + "/pv-1/dev", ondisk.RecordFile(blockPublishPath)}},
		{"unstage", nil, []string{blockStaging, blockDevices + "/pv-1", ondisk.RecordFile(blockStaging)}},
	} {
		t.Run(tc.op, func(t *testing.T) {
			e := heldBlockEnv(t)
			op := blockOps[tc.op]
			op.setUp(t, e)
			if len(tc.notHere) > 0 {
				// A teardown asks whether a path is a mount point by path,
				// which names the new root after the swap (tableMounter).
				mounter := tableMounter{e.mounter}
				e.p.mounter, e.p.ownMapper.Mounter = mounter, mounter
			}
			old := e.root + ".old"
			onFirstChange(e, func() error {
				if err := os.Rename(e.root, old); err != nil {
					return err
				}
				return os.Mkdir(e.root, 0o750)
			})
			if err := op.run(e); err != nil {
				t.Fatalf("%s: %v", tc.op, err)
			}
			if n := e.srv.Calls(op.method); n != 1 {
				t.Errorf("the driver got %d %s calls, want 1", n, op.method)
			}
			if entries, err := os.ReadDir(e.root); err != nil || len(entries) != 0 {
				t.Errorf("the new root holds %v (%v), want nothing", entries, err)
			}
			for _, p := range tc.there {
				if _, err := os.Lstat(filepath.Join(old, p)); err != nil {
					t.Errorf("%s is not in the root the operation started with: %v", p, err)
				}
			}
			for _, p := range tc.notHere {
				if _, err := os.Lstat(filepath.Join(old, p)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s is still in the root the operation started with (%v)", p, err)
				}
			}
			if tc.op == "unpublish" {
				for _, mp := range e.mounter.MountPoints {
					t.Errorf("%s is still mounted", mp.Path)
				}
			}
		})
	}
}

// TestBlockHeldRootRefusesSymlinks: a directory that a symlink replaces
// under the held root while an operation runs (right before its first
// change) is not followed: the operation fails naming the symlink, the
// driver gets no call through it, and nothing outside the root changes.
func TestBlockHeldRootRefusesSymlinks(t *testing.T) {
	for _, tc := range []struct {
		op, link string
		methods  []string // driver calls that must not have been made
	}{
		{"stage", blockDevices + "/staging", []string{"NodeStageVolume"}},
		{"publish", "pods", []string{"NodePublishVolume"}},
		{"unpublish", blockDevices + "/pv-1/dev", []string{"NodeUnpublishVolume"}},
		// The driver unstages (at the staging path, not through the
		// symlink) before the volume's directory is removed.
		{"unstage", blockDevices + "/pv-1", nil},
	} {
		t.Run(tc.op, func(t *testing.T) {
			e := heldBlockEnv(t)
			op := blockOps[tc.op]
			op.setUp(t, e)
			if err := os.MkdirAll(filepath.Join(e.root, blockDevices), 0o750); err != nil {
				t.Fatal(err)
			}
			out := outside(t, "keep")
			link := filepath.Join(e.root, tc.link)
			onFirstChange(e, func() error {
				if err := os.Rename(link, link+".aside"); err != nil && !errors.Is(err, fs.ErrNotExist) {
					return err
				}
				return os.Symlink(out, link)
			})
			c := newCheck(t, e, out, tc.methods...)
			e.mounter.ResetLog()
			c.assert(t, op.run(e), link)
		})
	}
}

// TestReconstructHoldsTheRoot: a reconstruction scans the root directory
// as it was when it started: when another directory takes the root's path
// at its first change (the removal of an empty leftover, pv-0), the staged
// block volume it finds next (pv-1) is found in the directory it started
// with, and the new one is left as it is.
func TestReconstructHoldsTheRoot(t *testing.T) {
	e := heldBlockEnv(t)
	blockOps["stage"].setUp(t, e)
	if err := blockOps["stage"].run(e); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(e.root, blockDevices, "pv-0/data"), 0o750); err != nil {
		t.Fatal(err)
	}
	old := e.root + ".old"
	onFirstChange(e, func() error {
		if err := os.Rename(e.root, old); err != nil {
			return err
		}
		return os.Mkdir(e.root, 0o750)
	})
	found := e.p.Reconstruct(context.Background(), volume.Recovery{MountPoints: map[string]bool{}})
	if len(found.Devices) != 1 || found.Devices[0].Spec.PVName != "pv-1" || found.Devices[0].Path != filepath.Join(e.root, blockStaging) {
		t.Errorf("found devices %+v, want pv-1's staged block device", found.Devices)
	}
	if _, err := os.Lstat(filepath.Join(old, blockDevices, "pv-0")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the leftover pv-0 is still in the root the scan started with (%v)", err)
	}
	if entries, err := os.ReadDir(e.root); err != nil || len(entries) != 0 {
		t.Errorf("the new root holds %v (%v), want nothing", entries, err)
	}
}
