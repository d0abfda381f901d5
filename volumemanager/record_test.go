package volumemanager

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/internal/rootfs"
	"github.com/nodevol/nodevol/podvol"
)

// plantPodVolume writes what a publish leaves in a pod volume directory:
// vol_data.json, an empty mount/ and, when rec is not nil, the record.
func plantPodVolume(t *testing.T, root, uid, name string, rec *ondisk.Record) string {
	t.Helper()
	rel := filepath.Join("pods", uid, "volumes", "kubernetes.io~csi", name)
	dir := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Join(dir, "mount"), 0o750); err != nil {
		t.Fatal(err)
	}
	data := `{"specVolID":"` + name + `","volumeHandle":"h-` + name + `","driverName":"d.example.com","volumeLifecycleMode":"Persistent"}`
	plantFile(t, filepath.Join(dir, ondisk.VolumeDataFile), data)
	if rec != nil {
		rec.Dir = rel
		b, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		plantFile(t, filepath.Join(root, ondisk.RecordFile(rel)), string(b))
	}
	return dir
}

func plantFile(t *testing.T, name, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestReconstructFromRecords: the record decides how a pod volume found
// on disk is recovered.
func TestReconstructFromRecords(t *testing.T) {
	rec := func(ph ondisk.Phase, boot string, version int) *ondisk.Record {
		return &ondisk.Record{Version: version, BootID: boot, Phase: ph, Driver: "d.example.com", VolumeHandle: "h-pv"}
	}
	for _, tc := range []struct {
		name      string
		rec       *ondisk.Record
		mounted   bool
		noTable   bool   // the mount table could not be read
		plant     string // a file written into mount/
		wantFound bool
		wantState podvol.MountState
		wantDir   bool // the directory is still there
	}{
		{"no record (the kubelet's)", nil, true, false, "", true, podvol.Uncertain, true},
		{"published, still mounted", rec(ondisk.PhasePublished, "boot-1", 1), true, false, "", true, podvol.Mounted, true},
		{"published, mount table unknown", rec(ondisk.PhasePublished, "boot-1", 1), true, true, "", true, podvol.Uncertain, true},
		{"published, mount gone", rec(ondisk.PhasePublished, "boot-1", 1), false, false, "", true, podvol.Uncertain, true},
		{"publish in flight", rec(ondisk.PhasePublishing, "boot-1", 1), true, false, "", true, podvol.Uncertain, true},
		{"unpublish in flight", rec(ondisk.PhaseUnpublishing, "boot-1", 1), false, false, "", true, podvol.Uncertain, true},
		{"record of a newer nodevol", rec(ondisk.PhasePublished, "boot-1", 2), true, false, "", true, podvol.Uncertain, true},
		{"rebooted", rec(ondisk.PhasePublished, "boot-0", 1), false, false, "", false, 0, false},
		{"rebooted mid-publish", rec(ondisk.PhasePublishing, "boot-0", 1), false, false, "", false, 0, false},
		{"rebooted, yet mounted", rec(ondisk.PhasePublished, "boot-0", 1), true, false, "", true, podvol.Uncertain, true},
		{"rebooted, mount table unknown", rec(ondisk.PhasePublished, "boot-0", 1), false, true, "", true, podvol.Uncertain, true},
		{"rebooted, data in mount/", rec(ondisk.PhasePublished, "boot-0", 1), false, false, "data", true, podvol.Uncertain, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			dir := plantPodVolume(t, root, "uid-a", "pv", tc.rec)
			if tc.plant != "" {
				plantFile(t, filepath.Join(dir, "mount", tc.plant), "x")
			}
			rc := recovery{BootID: "boot-1", MountPoints: map[string]bool{}}
			if tc.mounted {
				rc.MountPoints[filepath.Join(dir, "mount")] = true
			}
			if tc.noTable {
				rc.MountPoints = nil
			}
			got := reconstruct(context.Background(), root, rc)
			switch {
			case !tc.wantFound && len(got.Mounts) != 0:
				t.Errorf("found %+v, want nothing", got.Mounts)
			case tc.wantFound && (len(got.Mounts) != 1 || got.Mounts[0].State != tc.wantState):
				t.Errorf("found %+v, want one %v", got.Mounts, tc.wantState)
			}
			if _, err := os.Lstat(dir); tc.wantDir == errors.Is(err, fs.ErrNotExist) {
				t.Errorf("directory: %v, want it there: %v", err, tc.wantDir)
			}
			if tc.plant != "" {
				if _, err := os.Stat(filepath.Join(dir, "mount", tc.plant)); err != nil {
					t.Errorf("data removed: %v", err)
				}
			}
		})
	}
}

// TestReconstructRecordRescuesCorruptVolData: a pod volume whose
// vol_data.json is corrupt is reconstructed from its record (it would be
// left alone without one), and a record whose directory is gone is
// removed.
func TestReconstructRecordRescuesCorruptVolData(t *testing.T) {
	root := t.TempDir()
	dir := plantPodVolume(t, root, "uid-a", "pv", &ondisk.Record{Version: 1, BootID: "boot-1",
		Phase: ondisk.PhasePublished, Driver: "d.example.com", VolumeHandle: "h-pv", PVName: "pv", PodUID: "uid-a", SpecName: "pv"})
	plantFile(t, filepath.Join(dir, ondisk.VolumeDataFile), "{garbage")
	orphan := ondisk.RecordFile("pods/uid-gone/volumes/kubernetes.io~csi/pv")
	b, _ := json.Marshal(ondisk.Record{Version: 1, Phase: ondisk.PhasePublished, Dir: "pods/uid-gone/volumes/kubernetes.io~csi/pv", Driver: "d", VolumeHandle: "h"})
	plantFile(t, filepath.Join(root, orphan), string(b))

	got := reconstruct(context.Background(), root, recovery{BootID: "boot-1"})
	if len(got.Mounts) != 1 || got.Mounts[0].Spec.VolumeHandle != "h-pv" || got.Mounts[0].Spec.PVName != "pv" || len(got.Unreadable) != 0 {
		t.Errorf("found %+v (unreadable %v), want the volume from its record", got.Mounts, got.Unreadable)
	}
	if _, err := os.Lstat(filepath.Join(root, orphan)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("orphan record: %v, want removed", err)
	}
}

// startVMBoot is startVM with a mounter and a boot ID file of the test's.
func startVMBoot(t *testing.T, client *fake.Clientset, root string, drv *csitest.Server, m mount.Interface, bootFile string) (*VolumeManager, func()) {
	t.Helper()
	return startVMWith(t, Config{NodeName: node, KubeClient: client, RootDir: root, Mounter: m, BootIDPath: bootFile}, drv)
}

// restartEnv mounts pods a and b with one volume manager and stops it.
type restartEnv struct {
	drv          *csitest.Server
	client       *fake.Clientset
	root, boot   string
	podA, podB   *v1.Pod
	dirA, dirB   string // pod volume directories
	stageA       string // staging directory of a's volume
	stagingPathA string
}

func newRestartEnv(t *testing.T) *restartEnv {
	e := &restartEnv{drv: csitest.New(t, csitest.Options{CreateTargetDirs: true}), root: t.TempDir()}
	pvcA, pvA := csitest.BoundClaim("ns", "a", csitest.PVSpec{Driver: e.drv.DriverName(), Handle: "handle-a"})
	pvcB, pvB := csitest.BoundClaim("ns", "b", csitest.PVSpec{Driver: e.drv.DriverName(), Handle: "handle-b"})
	e.client = fake.NewClientset(csitest.CSIDriver(e.drv.DriverName(), csitest.CSIDriverSpec{}), pvcA, pvA, pvcB, pvB)
	e.boot = filepath.Join(t.TempDir(), "boot_id")
	plantFile(t, e.boot, "boot-1\n")
	e.podA = csitest.Pod("ns", "a", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "a"}}})
	e.podB = csitest.Pod("ns", "b", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "b"}}})
	e.dirA, _ = ondisk.PodVolumeDir(e.root, e.podA.UID, pvA.Name)
	e.dirB, _ = ondisk.PodVolumeDir(e.root, e.podB.UID, pvB.Name)
	e.stageA, _ = ondisk.StagingDir(e.root, e.drv.DriverName(), "handle-a")
	e.stagingPathA, _ = ondisk.StagingPath(e.root, e.drv.DriverName(), "handle-a")

	vm, stop := startVMBoot(t, e.client, e.root, e.drv, mount.NewFakeMounter(nil), e.boot)
	for _, p := range []*v1.Pod{e.podA, e.podB} {
		vm.AddPod(p)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := vm.WaitForAttachAndMount(ctx, p)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	stop()
	return e
}

// keepsAOnly waits until pod a is mounted, pod b's volume torn down and
// vm idle, and checks that the CSI calls since before are b's teardown
// alone (what: the moment, for the error).
func (e *restartEnv) keepsAOnly(t *testing.T, vm *VolumeManager, before map[string]int, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := vm.WaitForAttachAndMount(ctx, e.podA); err != nil {
		t.Fatal(err)
	}
	if err := vm.WaitForUnmount(ctx, e.podB); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, vm)
	want := map[string]int{"NodeUnpublishVolume": 1, "NodeUnstageVolume": 1}
	if got := e.callsSince(before); !equalCounts(got, want) {
		t.Errorf("CSI calls %s = %v, want %v (b's teardown, none for pod a)", what, got, want)
	}
}

func (e *restartEnv) calls() map[string]int {
	m := map[string]int{}
	for _, method := range []string{"NodeStageVolume", "NodePublishVolume", "NodeUnpublishVolume", "NodeUnstageVolume"} {
		m[method] = e.drv.Calls(method)
	}
	return m
}

func (e *restartEnv) callsSince(before map[string]int) map[string]int {
	now := e.calls()
	for k, v := range before {
		now[k] -= v
		if now[k] == 0 {
			delete(now, k)
		}
	}
	return now
}

// TestRestartTrustsDoneRecords: after a crash (same boot), a pod volume
// and staged device whose records say done and whose mount points are
// still mounted are Mounted at once: the pod added again costs no CSI
// call at all. The kubelet (no record) publishes it again.
func TestRestartTrustsDoneRecords(t *testing.T) {
	e := newRestartEnv(t)
	// The fake mounter shows a's mounts (the in-process driver makes none).
	m := mount.NewFakeMounter([]mount.MountPoint{
		{Path: filepath.Join(e.dirA, "mount"), Device: "/dev/a", Type: "ext4"},
		{Path: e.stagingPathA, Device: "/dev/a", Type: "ext4"},
	})
	before := e.calls()
	vm, stop := startVMBoot(t, e.client, e.root, e.drv, m, e.boot)
	defer stop()
	if vols := vm.GetMountedVolumesForPod(e.podA.UID); len(vols) != 1 || vols[0].State != podvol.Mounted {
		t.Errorf("pod a's volumes right after the restart = %+v, want one Mounted", vols)
	}
	vm.AddPod(e.podA)
	vm.MarkPodsSynced()
	// b had no mount point left: Uncertain, torn down (its device too).
	e.keepsAOnly(t, vm, before, "after the restart")
	if _, err := os.Lstat(filepath.Join(e.root, ondisk.RecordFile(relTo(t, e.root, e.dirB)))); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("pod b's record after teardown: %v, want removed", err)
	}
}

// TestRestartAfterReboot: with another boot ID nothing is mounted any
// more: the volumes of a pod that is gone are forgotten without a CSI
// call (their directories and records removed at start, nothing possibly
// mounted), and a pod still wanted is staged and published afresh.
func TestRestartAfterReboot(t *testing.T) {
	e := newRestartEnv(t)
	plantFile(t, e.boot, "boot-2\n")
	before := e.calls()
	vm, stop := startVMBoot(t, e.client, e.root, e.drv, mount.NewFakeMounter(nil), e.boot)
	defer stop()
	if vm.HasPossiblyMountedVolumesForPod(e.podA.UID) || vm.HasPossiblyMountedVolumesForPod(e.podB.UID) {
		t.Errorf("possibly mounted after a reboot: a %v, b %v; want neither",
			vm.HasPossiblyMountedVolumesForPod(e.podA.UID), vm.HasPossiblyMountedVolumesForPod(e.podB.UID))
	}
	for _, dir := range []string{e.dirB, e.dirA, e.stageA} {
		if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s after the restart: %v, want removed", dir, err)
		}
	}
	vm.AddPod(e.podA)
	vm.MarkPodsSynced()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := vm.WaitForAttachAndMount(ctx, e.podA); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, vm)
	want := map[string]int{"NodeStageVolume": 1, "NodePublishVolume": 1}
	if got := e.callsSince(before); !equalCounts(got, want) {
		t.Errorf("CSI calls after the reboot = %v, want %v", got, want)
	}
	rec, err := ondisk.ReadRecord(mustRoot(t, e.root), relTo(t, e.root, e.dirA))
	if err != nil || rec.BootID != "boot-2" || rec.Phase != ondisk.PhasePublished {
		t.Errorf("pod a's record after the reboot = %+v, %v; want Published on boot-2", rec, err)
	}
}

// TestRestartFinishesCallInFlight: a publish recorded in flight is
// repeated for a pod still wanted, even though the mount point is there.
func TestRestartFinishesCallInFlight(t *testing.T) {
	e := newRestartEnv(t)
	r := mustRoot(t, e.root)
	rel := relTo(t, e.root, e.dirA)
	rec, err := ondisk.ReadRecord(r, rel)
	if err != nil {
		t.Fatal(err)
	}
	rec.Phase = ondisk.PhasePublishing // as if killed inside NodePublishVolume
	b, _ := json.Marshal(rec)
	plantFile(t, filepath.Join(e.root, ondisk.RecordFile(rel)), string(b))
	m := mount.NewFakeMounter([]mount.MountPoint{
		{Path: filepath.Join(e.dirA, "mount"), Device: "/dev/a", Type: "ext4"},
		{Path: e.stagingPathA, Device: "/dev/a", Type: "ext4"},
	})
	before := e.calls()
	vm, stop := startVMBoot(t, e.client, e.root, e.drv, m, e.boot)
	defer stop()
	vm.AddPod(e.podA)
	vm.AddPod(e.podB)
	vm.MarkPodsSynced()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, p := range []*v1.Pod{e.podA, e.podB} {
		if err := vm.WaitForAttachAndMount(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	waitIdle(t, vm)
	// a: the publish in flight is repeated (its device was recorded
	// staged and is still mounted); b: no record of use (no mount point):
	// staged and published again, as the kubelet would.
	want := map[string]int{"NodePublishVolume": 2, "NodeStageVolume": 1}
	if got := e.callsSince(before); !equalCounts(got, want) {
		t.Errorf("CSI calls after the restart = %v, want %v", got, want)
	}
}

func equalCounts(a, b map[string]int) bool {
	for k, v := range a {
		if v != 0 && b[k] != v {
			return false
		}
	}
	for k, v := range b {
		if a[k] != v {
			return false
		}
	}
	return true
}

func mustRoot(t *testing.T, root string) *rootfs.Root {
	t.Helper()
	r, err := rootfs.New(root)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func relTo(t *testing.T, root, dir string) string {
	t.Helper()
	rel, err := filepath.Rel(root, dir)
	if err != nil {
		t.Fatal(err)
	}
	return rel
}

// TestRestartTakesBackRecordName: a pod volume's record replaced by a
// symlink (issue 23, crash window 3) does not block the pod: after a
// restart the volume is published again and recorded, the symlink removed
// without being followed. Before, every publish failed on the symlink
// until a person removed it.
func TestRestartTakesBackRecordName(t *testing.T) {
	e := newRestartEnv(t)
	recFile := filepath.Join(e.root, ondisk.RecordFile(relTo(t, e.root, e.dirA)))
	outside := filepath.Join(t.TempDir(), "outside")
	plantFile(t, outside, "keep")
	if err := os.Remove(recFile); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, recFile); err != nil {
		t.Fatal(err)
	}
	vm, stop := startVMBoot(t, e.client, e.root, e.drv, mount.NewFakeMounter(nil), e.boot)
	defer stop()
	vm.AddPod(e.podA)
	vm.AddPod(e.podB)
	vm.MarkPodsSynced()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := vm.WaitForAttachAndMount(ctx, e.podA); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(recFile); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("pod a's record: %v, %v; want a regular file", fi, err)
	}
	if rec, err := ondisk.ReadRecord(mustRoot(t, e.root), relTo(t, e.root, e.dirA)); err != nil || rec.Phase != ondisk.PhasePublished {
		t.Errorf("pod a's record = %+v, %v; want Published", rec, err)
	}
	if b, err := os.ReadFile(outside); err != nil || string(b) != "keep" {
		t.Errorf("the symlink's target: %q, %v; want it untouched", b, err)
	}
}
