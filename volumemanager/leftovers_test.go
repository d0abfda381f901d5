package volumemanager

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/ondisk"
)

// TestReconstructRemovesWriteLeftovers: the temporary file of a
// vol_data.json write cut short by a crash, in a pod volume directory or a
// staging directory, is removed when the volume is reconstructed (the
// kubelet's teardown rmdirs these directories after a hand-over, and fails
// on a file it does not know); the volumes are found as before and nothing
// else is touched.
func TestReconstructRemovesWriteLeftovers(t *testing.T) {
	root := t.TempDir()
	podDir := plantPodVolume(t, root, "uid-a", "pv", nil)
	stageDir := filepath.Join(root, "plugins", "kubernetes.io", "csi", "d.example.com", "0123abcd")
	plantFile(t, filepath.Join(stageDir, ondisk.VolumeDataFile), `{"specVolID":"pv","volumeHandle":"h-pv","driverName":"d.example.com"}`)
	if err := os.MkdirAll(filepath.Join(stageDir, "globalmount"), 0o750); err != nil {
		t.Fatal(err)
	}
	leftovers := []string{
		filepath.Join(podDir, ".vol_data.json.tmp-0a1b2c3d4e5f"),
		filepath.Join(stageDir, ".vol_data.json.tmp-5f4e3d2c1b0a"),
	}
	kept := []string{filepath.Join(podDir, "mount", ".vol_data.json.tmp-data"), filepath.Join(podDir, ondisk.VolumeDataFile)}
	for _, p := range append(leftovers, kept...) {
		if _, err := os.Stat(p); err != nil {
			plantFile(t, p, "{")
		}
	}
	rc := recovery{BootID: "boot-1", MountPoints: map[string]bool{filepath.Join(podDir, "mount"): true, filepath.Join(stageDir, "globalmount"): true}}
	got := reconstruct(context.Background(), root, rc)
	if len(got.Mounts) != 1 {
		t.Errorf("pod volumes found: %+v, want the one", got.Mounts)
	}
	for _, p := range leftovers {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: %v, want removed", p, err)
		}
	}
	for _, p := range kept {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("%s: %v, want it kept", p, err)
		}
	}
}

// plantTree creates entries under dir: "name/" a directory, "name" a file
// holding content.
func plantTree(t *testing.T, dir, content string, entries ...string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if name, isDir := strings.CutSuffix(e, "/"); isDir {
			if err := os.MkdirAll(filepath.Join(dir, name), 0o750); err != nil {
				t.Fatal(err)
			}
			continue
		}
		plantFile(t, filepath.Join(dir, e), content)
	}
}

// TestReconstructRemovesEmptyPodVolumeDir: a pod volume directory
// without a readable vol_data.json that cannot hold data (SetUp stopped
// after creating it: issue 23, crash window 2) is removed at start
// instead of holding the device of the PV it is named after for good.
// Anything that may hold data, or may be mounted, stays and holds it.
func TestReconstructRemovesEmptyPodVolumeDir(t *testing.T) {
	for _, tc := range []struct {
		name    string
		plant   []string // entries of the directory ("x/" a directory)
		content string   // of the files planted
		mounted string   // entry that is a mount point ("." the directory)
		noTable bool     // the mount table could not be read
		want    bool     // removed
	}{
		{name: "empty", want: true},
		{name: "empty mount", plant: []string{"mount/"}, want: true},
		{name: "temp file of a write", plant: []string{"mount/", ".vol_data.json.tmp-0a1b2c3d4e5f"}, content: `{"volumeHa`, want: true},
		{name: "corrupt vol_data.json", plant: []string{"mount/", ondisk.VolumeDataFile}, content: "{garbage", want: true},
		{name: "mount is a mount point", plant: []string{"mount/"}, mounted: "mount"},
		{name: "directory is a mount point", mounted: "."},
		{name: "mount table unknown", plant: []string{"mount/"}, noTable: true},
		{name: "data in mount", plant: []string{"mount/", "mount/data"}, content: "data"},
		{name: "a file nodevol did not write", plant: []string{"mount/", "notes"}, content: "x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			dir := filepath.Join(root, "pods", "uid-a", "volumes", "kubernetes.io~csi", "pv")
			plantTree(t, dir, tc.content, tc.plant...)
			rc := recovery{BootID: "boot-1", MountPoints: map[string]bool{}}
			if tc.mounted != "" {
				rc.MountPoints[filepath.Join(dir, tc.mounted)] = true
			}
			if tc.noTable {
				rc.MountPoints = nil
			}
			got := reconstruct(context.Background(), root, rc)
			_, err := os.Lstat(dir)
			switch {
			case len(got.Mounts) != 0:
				t.Errorf("reconstructed %+v from a directory without vol_data.json", got.Mounts)
			case tc.want && (len(got.Unreadable) != 0 || !errors.Is(err, fs.ErrNotExist)):
				t.Errorf("unreadable %v, directory: %v; want it removed, holding nothing", got.Unreadable, err)
			case !tc.want && (!slices.Equal(got.Unreadable, []string{dir}) || err != nil):
				t.Errorf("unreadable %v, directory: %v; want it left and holding the PV's device", got.Unreadable, err)
			}
			for _, e := range tc.plant {
				if _, err := os.Lstat(filepath.Join(dir, e)); !tc.want && err != nil {
					t.Errorf("%s of a directory left alone: %v", e, err)
				}
			}
		})
	}
}

// TestRestartUnstagesDeviceOfEmptyPodVolumeDir: a device staged before a
// stop that left its pod's volume directory empty (SetUp stopped between
// creating it and writing vol_data.json) is unstaged once no pod wants it,
// and both directories are gone; before the fix the empty directory held
// the device staged, and in use, for good.
func TestRestartUnstagesDeviceOfEmptyPodVolumeDir(t *testing.T) {
	e := newStagedNode(t)
	drv, client, root, staging, podDir := e.drv, e.client, e.root, e.staging, e.podDir
	plantTree(t, podDir, "")

	vm, stop := startVM(t, client, root, drv)
	defer stop()
	vm.MarkPodsSynced()
	eventually(t, "the device unstaged and no longer in use", func() bool {
		return len(knownVolumes(vm)) == 0 && drv.Calls("NodeUnstageVolume") == 1
	})
	for _, dir := range []string{podDir, staging} {
		if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: %v, want removed", dir, err)
		}
	}
}

// TestReconstructRemovesEmptyStagingDir: a staging directory without
// vol_data.json that holds nothing but an empty, unmounted globalmount,
// the temporary files of a vol_data.json write and its record
// (MountDevice stopped after creating it: issue 23, crash window 4) is
// removed at start; nothing reconstructs it, so nothing else would. One
// that may hold data or be mounted, or that is not named as nodevol names
// staging directories, is left.
func TestReconstructRemovesEmptyStagingDir(t *testing.T) {
	const handleDir = "a3f1c2d4e5b60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90" // a sha256
	for _, tc := range []struct {
		name    string
		dir     string   // under plugins/kubernetes.io/csi
		plant   []string // entries of the directory ("x/" a directory)
		record  bool     // with a record (of a stage in flight)
		mounted string   // entry that is a mount point
		noTable bool     // the mount table could not be read
		want    bool     // removed
	}{
		{name: "empty globalmount", dir: "d.example.com/" + handleDir, plant: []string{"globalmount/"}, want: true},
		{name: "empty", dir: "d.example.com/" + handleDir, want: true},
		{name: "temp file and record", dir: "d.example.com/" + handleDir, plant: []string{"globalmount/", ".vol_data.json.tmp-0a1b2c3d4e5f"}, record: true, want: true},
		{name: "globalmount mounted", dir: "d.example.com/" + handleDir, plant: []string{"globalmount/"}, mounted: "globalmount"},
		{name: "mount table unknown", dir: "d.example.com/" + handleDir, plant: []string{"globalmount/"}, noTable: true},
		{name: "data in globalmount", dir: "d.example.com/" + handleDir, plant: []string{"globalmount/", "globalmount/data"}},
		{name: "a file nodevol did not write", dir: "d.example.com/" + handleDir, plant: []string{"globalmount/", "notes"}},
		{name: "not a staging directory's name", dir: "d.example.com/pv-1", plant: []string{"globalmount/"}},
		{name: "an older kubelet's", dir: "pv/pv-1", plant: []string{"globalmount/"}},
		// An empty block volume directory goes too (block leftovers, see
		// TestCrashPoints); one with a map file stays.
		{name: "raw block tree", dir: "volumeDevices/" + handleDir, plant: []string{"dev/", "dev/uid"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			rel := filepath.Join("plugins/kubernetes.io/csi", tc.dir)
			dir := filepath.Join(root, rel)
			plantTree(t, dir, "x", tc.plant...)
			recFile := filepath.Join(root, ondisk.RecordFile(rel))
			if tc.record {
				b, _ := json.Marshal(ondisk.Record{Version: 1, BootID: "boot-1", Phase: ondisk.PhaseStaging, Dir: rel, Driver: "d.example.com", VolumeHandle: "h"})
				plantFile(t, recFile, string(b))
			}
			rc := recovery{BootID: "boot-1", MountPoints: map[string]bool{}}
			if tc.mounted != "" {
				rc.MountPoints[filepath.Join(dir, tc.mounted)] = true
			}
			if tc.noTable {
				rc.MountPoints = nil
			}
			got := reconstruct(context.Background(), root, rc)
			if len(got.Devices) != 0 {
				t.Errorf("reconstructed %+v from a directory without vol_data.json", got.Devices)
			}
			if _, err := os.Lstat(dir); tc.want != errors.Is(err, fs.ErrNotExist) {
				t.Errorf("directory: %v, want removed: %v", err, tc.want)
			}
			if _, err := os.Lstat(recFile); tc.record && !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("record: %v, want removed with its directory", err)
			}
			for _, e := range tc.plant {
				if _, err := os.Lstat(filepath.Join(dir, e)); !tc.want && err != nil {
					t.Errorf("%s of a directory left alone: %v", e, err)
				}
			}
		})
	}
}

// TestUnreadableDirTakenBackOnceEmptied: a pod volume directory that
// holds a file nodevol did not write is left alone at start and holds the
// device of the PV it is named after; once the file is gone (a person
// removed it), the resync removes the directory and the device is
// unstaged, with no restart.
func TestUnreadableDirTakenBackOnceEmptied(t *testing.T) {
	e := newStagedNode(t)
	drv, client, root, podDir := e.drv, e.client, e.root, e.podDir
	plantTree(t, podDir, "x", "mount/", "notes")

	vm, stop := startVMWith(t, Config{NodeName: node, KubeClient: client, RootDir: root, Mounter: mount.NewFakeMounter(nil),
		ResyncPeriod: 20 * time.Millisecond}, drv)
	defer stop()
	vm.MarkPodsSynced()
	waitIdle(t, vm)
	if n := drv.Calls("NodeUnstageVolume"); n != 0 || len(knownVolumes(vm)) != 1 {
		t.Fatalf("with a stranger's file in %s: %d unstages, in use %v; want the device held", podDir, n, knownVolumes(vm))
	}
	if err := os.Remove(filepath.Join(podDir, "notes")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the device unstaged once the file is gone", func() bool {
		return len(knownVolumes(vm)) == 0 && drv.Calls("NodeUnstageVolume") == 1
	})
	if _, err := os.Lstat(podDir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s: %v, want removed", podDir, err)
	}
}

// stagedNode is a root where a stop left PV pv-x's device staged (its
// staging directory and vol_data.json), and the path of pod uid-x's volume
// directory of it, for the test to plant.
type stagedNode struct {
	drv                   *csitest.Server
	client                *fake.Clientset
	root, staging, podDir string
}

func newStagedNode(t *testing.T) stagedNode {
	t.Helper()
	e := stagedNode{drv: csitest.New(t, csitest.Options{CreateTargetDirs: true}), root: t.TempDir()}
	e.client = fake.NewClientset(csitest.CSIDriver(e.drv.DriverName(), csitest.CSIDriverSpec{}))
	var err error
	if e.staging, err = ondisk.StagingDir(e.root, e.drv.DriverName(), "handle-x"); err != nil {
		t.Fatal(err)
	}
	plantTree(t, e.staging, "", "globalmount/")
	plantFile(t, filepath.Join(e.staging, ondisk.VolumeDataFile), `{"specVolID":"pv-x","volumeHandle":"handle-x","driverName":"`+e.drv.DriverName()+`"}`)
	e.podDir = filepath.Join(e.root, "pods", "uid-x", "volumes", "kubernetes.io~csi", "pv-x")
	return e
}
