package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/mount-utils"
	testingexec "k8s.io/utils/exec/testing"

	"github.com/nodevol/nodevol/internal/blockdev"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/step"
	"github.com/nodevol/nodevol/volume"
)

// fakeLoop is a Looper that remembers which file each loop device holds.
type fakeLoop struct {
	mu      sync.Mutex
	devices map[string]string // file -> device
	next    int
}

func (f *fakeLoop) Attach(_ context.Context, path string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next++
	dev := fmt.Sprintf("/dev/loop%d", f.next)
	f.devices[path] = dev
	return dev, nil
}

func (f *fakeLoop) Find(_ context.Context, path string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.devices[path], nil
}

func (f *fakeLoop) Detach(_ context.Context, dev string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for file, d := range f.devices {
		if d == dev {
			delete(f.devices, file)
		}
	}
	return nil
}

// flakyMounter is a fake mounter whose mounts fail (leaving the mount
// when leave is set) and whose unmounts fail, on demand.
type flakyMounter struct {
	*mount.FakeMounter
	failMount, leave, failUnmount bool
}

func (m *flakyMounter) MountSensitiveWithoutSystemd(source, target, fstype string, options, sensitive []string) error {
	return m.MountSensitive(source, target, fstype, options, sensitive)
}

func (m *flakyMounter) Mount(source, target, fstype string, options []string) error {
	return m.MountSensitive(source, target, fstype, options, nil)
}

func (m *flakyMounter) MountSensitive(source, target, fstype string, options, sensitive []string) error {
	if !m.failMount {
		return m.FakeMounter.MountSensitive(source, target, fstype, options, sensitive)
	}
	if m.leave {
		_ = m.FakeMounter.MountSensitive(source, target, fstype, options, sensitive)
	}
	return errors.New("mount failed")
}

func (m *flakyMounter) Unmount(target string) error {
	if m.failUnmount {
		return errors.New("device is busy")
	}
	return m.FakeMounter.Unmount(target)
}

func (f *fixture) failMounts(mount, leave, unmount bool) {
	f.flaky.failMount, f.flaky.leave, f.flaky.failUnmount = mount, leave, unmount
}

// fixture is a plugin on a fake mounter in a temporary root, with a local
// PV directory and a file standing for a block device.
type fixture struct {
	p       *plugin
	root    string
	dir     string // the PV's directory
	dev     string // the "block device"
	mounter *mount.FakeMounter
	flaky   *flakyMounter
	loop    *fakeLoop
	exec    *testingexec.FakeExec
	events  *record.FakeRecorder
	steps   []string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{root: t.TempDir(), mounter: mount.NewFakeMounter(nil), loop: &fakeLoop{devices: map[string]string{}},
		exec: &testingexec.FakeExec{}, events: record.NewFakeRecorder(10)}
	src := t.TempDir()
	f.dir, f.dev = filepath.Join(src, "vol"), filepath.Join(src, "sdb")
	if err := os.Mkdir(f.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.dev, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	hook := func(s step.Step) error {
		f.steps = append(f.steps, string(s.Op)+" "+strings.TrimPrefix(s.Path, f.root+"/"))
		return nil
	}
	f.flaky = &flakyMounter{FakeMounter: f.mounter}
	mapper := &blockdev.Mapper{Mounter: step.Mounter(f.flaky, hook), Loop: f.loop, Steps: hook,
		IsBlockDevice: func(path string) (bool, error) { return path == f.dev, nil }}
	p, err := newPlugin(Config{RootDir: f.root, Mounter: f.flaky, BlockMapper: mapper, Exec: f.exec, EventRecorder: f.events, Steps: hook})
	if err != nil {
		t.Fatal(err)
	}
	p.fileType = func(path string) (fileKind, error) {
		if path == f.dev {
			return kindBlockDevice, nil
		}
		return statFileType(path)
	}
	f.p = p
	return f
}

// spec is PV pv's volume spec with local path path.
func spec(pv, path string, mode podvol.VolumeMode) *podvol.VolumeSpec {
	return &podvol.VolumeSpec{Name: volumeName(pv), Plugin: PluginName, PVName: pv, Mode: mode,
		PVSource: &v1.PersistentVolumeSource{Local: &v1.LocalVolumeSource{Path: path}}}
}

func podVol(uid string) podvol.PodVolume {
	return podvol.PodVolume{Pod: podvol.PodRef{UID: types.UID(uid), Namespace: "ns", Name: "pod-" + uid}, SpecName: "data"}
}

// mounts lists the fake mount table as "device -> path [options]", paths
// relative to the root.
func (f *fixture) mounts() []string {
	var out []string
	for _, mp := range f.mounter.MountPoints {
		rel := func(p string) string { return strings.TrimPrefix(p, f.root+"/") }
		out = append(out, fmt.Sprintf("%s -> %s %v", rel(mp.Device), rel(mp.Path), mp.Opts))
	}
	slices.Sort(out)
	return out
}

func (f *fixture) exists(rel string) bool {
	_, err := os.Lstat(filepath.Join(f.root, rel))
	return err == nil
}

// TestNames: the plugin's name, the sources it claims and its capabilities.
func TestNames(t *testing.T) {
	f := newFixture(t)
	if f.p.Name() != "kubernetes.io/local-volume" {
		t.Errorf("Name = %q", f.p.Name())
	}
	if f.p.CanSupport(&v1.Volume{VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/x"}}}) {
		t.Error("CanSupport claims a pod volume: local volumes are PVs only")
	}
	if !f.p.CanSupportPV(&v1.PersistentVolume{Spec: v1.PersistentVolumeSpec{PersistentVolumeSource: v1.PersistentVolumeSource{Local: &v1.LocalVolumeSource{Path: "/x"}}}}) {
		t.Error("CanSupportPV refuses a local PV")
	}
	if f.p.CanSupportPV(&v1.PersistentVolume{}) || f.p.CanSupportPV(nil) {
		t.Error("CanSupportPV claims a PV without a local source")
	}
	for mode, want := range map[podvol.VolumeMode]volume.Capabilities{
		podvol.Filesystem: {Stages: true, Block: true, OwnershipChange: true},
		podvol.Block:      {Stages: true, Block: true},
	} {
		got, err := f.p.Capabilities(spec("pv", "/x", mode))
		if err != nil || got.Stages != want.Stages || got.Block != want.Block || got.OwnershipChange != want.OwnershipChange || got.Attachable {
			t.Errorf("Capabilities(%s) = %+v, %v; want %+v", mode, got, err, want)
		}
	}
}
