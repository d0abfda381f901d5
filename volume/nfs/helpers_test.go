package nfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/step"
)

// flakyMounter is a fake mounter whose mounts fail as mount(8) fails
// (leaving the mount when leave is set) and whose unmounts fail, on
// demand.
type flakyMounter struct {
	*mount.FakeMounter
	failMount, leave, failUnmount bool
}

func (m *flakyMounter) MountSensitiveWithoutSystemd(source, target, fstype string, options, sensitive []string) error {
	if !m.failMount {
		return m.FakeMounter.MountSensitiveWithoutSystemd(source, target, fstype, options, sensitive)
	}
	if m.leave {
		_ = m.FakeMounter.MountSensitiveWithoutSystemd(source, target, fstype, options, sensitive)
	}
	// mount-utils' text for a failed mount(8).
	return fmt.Errorf("mount failed: exit status 32\nMounting command: mount\nMounting arguments: -t %s -o %s %s %s\nOutput: mount.nfs: Connection timed out",
		fstype, strings.Join(options, ","), source, target)
}

func (m *flakyMounter) Unmount(target string) error {
	if m.failUnmount {
		return errors.New("umount: device is busy")
	}
	return m.FakeMounter.Unmount(target)
}

// forceMounter is a flakyMounter that can force an unmount, as mount.New's.
type forceMounter struct {
	*flakyMounter
	timeouts []time.Duration
}

func (m *forceMounter) UnmountWithForce(target string, timeout time.Duration) error {
	m.timeouts = append(m.timeouts, timeout)
	return m.Unmount(target)
}

// fixture is a plugin on a fake mounter in a temporary root.
type fixture struct {
	p       *plugin
	root    string
	mounter *mount.FakeMounter
	flaky   *flakyMounter
	steps   []string
}

// newFixture builds the plugin on a flakyMounter, or on a forceMounter
// when force is set (returned for its record of timeouts).
func newFixture(t *testing.T, force bool) (*fixture, *forceMounter) {
	t.Helper()
	f := &fixture{root: t.TempDir(), mounter: mount.NewFakeMounter(nil)}
	f.flaky = &flakyMounter{FakeMounter: f.mounter}
	hook := func(s step.Step) error {
		f.steps = append(f.steps, string(s.Op)+" "+strings.TrimPrefix(s.Path, f.root+"/"))
		return nil
	}
	var m mount.Interface = f.flaky
	var fm *forceMounter
	if force {
		fm = &forceMounter{flakyMounter: f.flaky}
		m = fm
	}
	p, err := New(Config{RootDir: f.root, Mounter: m, Steps: hook})
	if err != nil {
		t.Fatal(err)
	}
	f.p = p.(*plugin)
	return f, fm
}

// inline is the spec of pod volume "data" with an nfs source.
func inline(uid, server, path string, readOnly bool) *podvol.VolumeSpec {
	return &podvol.VolumeSpec{Name: volumeName(types.UID(uid), "data"), Plugin: PluginName, Mode: podvol.Filesystem, Ephemeral: true,
		Source: &v1.VolumeSource{NFS: &v1.NFSVolumeSource{Server: server, Path: path, ReadOnly: readOnly}}}
}

// pvSpec is the spec of PV pv with an nfs source, as the volume manager
// resolves it for a pod.
func pvSpec(uid, pv, server, path string, options []string) *podvol.VolumeSpec {
	return &podvol.VolumeSpec{Name: volumeName(types.UID(uid), pv), Plugin: PluginName, PVName: pv, Mode: podvol.Filesystem, Ephemeral: true,
		MountOptions: options, PVSource: &v1.PersistentVolumeSource{NFS: &v1.NFSVolumeSource{Server: server, Path: path}}}
}

func podVol(uid string) podvol.PodVolume {
	return podvol.PodVolume{Pod: podvol.PodRef{UID: types.UID(uid), Namespace: "ns", Name: "pod-" + uid}, SpecName: "data"}
}

// mounts lists the fake mount table as "device -> path type [options]",
// paths relative to the root.
func (f *fixture) mounts() []string {
	var out []string
	for _, mp := range f.mounter.MountPoints {
		out = append(out, fmt.Sprintf("%s -> %s %s %v", mp.Device, strings.TrimPrefix(mp.Path, f.root+"/"), mp.Type, mp.Opts))
	}
	slices.Sort(out)
	return out
}

func (f *fixture) exists(rel string) bool {
	_, err := os.Lstat(filepath.Join(f.root, rel))
	return err == nil
}

// mkdir makes rel below the root.
func (f *fixture) mkdir(t *testing.T, rel string) string {
	t.Helper()
	dir := filepath.Join(f.root, rel)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	return dir
}
