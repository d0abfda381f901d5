package volumemanager

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nodevol/nodevol/csiplugin"
	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/podvol"
)

// TestLegacyStagingReconstructed: a node an older kubelet ran, with volume
// a staged under plugins/kubernetes.io/csi/pv/{pv}/globalmount and
// published for pod a, and volume b staged there with no pod left (a stop
// between unpublish and unstage). nodevol finds both devices there; pod a
// added again gets NodeStageVolume and NodePublishVolume with the legacy
// staging_target_path; after MarkPodsSynced b is unstaged from it; when
// pod a goes, a too. Each legacy directory is removed, the pv/ directory
// kept, and nothing is ever staged at the hashed path.
func TestLegacyStagingReconstructed(t *testing.T) {
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
	pvcA, pvA := csitest.BoundClaim("ns", "a", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-a"})
	pvcB, pvB := csitest.BoundClaim("ns", "b", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-b"})
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{}), pvcA, pvA, pvcB, pvB)
	root := t.TempDir()
	podA := csitest.Pod("ns", "a", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "a"}}})

	legacyA := oldKubeletStaged(t, root, pvA.Name, drv.DriverName(), "handle-a")
	legacyB := oldKubeletStaged(t, root, pvB.Name, drv.DriverName(), "handle-b")
	podDirA, _ := ondisk.PodVolumeDir(root, podA.UID, pvA.Name)
	writeJSON(t, filepath.Join(podDirA, ondisk.VolumeDataFile), map[string]string{
		"specVolID": pvA.Name, "volumeHandle": "handle-a", "driverName": drv.DriverName(), "nodeName": node,
		"attachmentID": csiplugin.AttachmentName("handle-a", drv.DriverName(), node), "volumeLifecycleMode": "Persistent",
	})
	if err := os.MkdirAll(filepath.Join(podDirA, "mount"), 0o750); err != nil {
		t.Fatal(err)
	}

	// What the disk gives, before any pod: both devices at their legacy path.
	got := reconstruct(context.Background(), root, recovery{})
	devices := map[podvol.UniqueVolumeName]string{}
	for _, d := range got.Devices {
		devices[d.Spec.Name] = d.Path
	}
	nameA, nameB := podvol.CSIVolumeName(drv.DriverName(), "handle-a"), podvol.CSIVolumeName(drv.DriverName(), "handle-b")
	want := map[podvol.UniqueVolumeName]string{nameA: filepath.Join(legacyA, "globalmount"), nameB: filepath.Join(legacyB, "globalmount")}
	if len(devices) != 2 || devices[nameA] != want[nameA] || devices[nameB] != want[nameB] {
		t.Fatalf("reconstructed devices = %v, want %v", devices, want)
	}

	vm, stop := startVM(t, client, root, drv)
	defer stop()
	vm.AddPod(podA)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := vm.WaitForAttachAndMount(ctx, podA); err != nil {
		t.Fatal(err)
	}
	vm.MarkPodsSynced()
	eventually(t, "volume b unstaged", func() bool { return slices.Equal(knownVolumes(vm), []podvol.UniqueVolumeName{nameA}) })
	vm.DeletePod(podA)
	if err := vm.WaitForUnmount(ctx, podA); err != nil {
		t.Fatal(err)
	}
	eventually(t, "volume a unstaged", func() bool { return len(knownVolumes(vm)) == 0 })

	type call struct{ method, volume, staging string }
	var calls []call
	for _, r := range drv.Requests() {
		switch req := r.Req.(type) {
		case *csi.NodeStageVolumeRequest:
			calls = append(calls, call{r.Method, req.GetVolumeId(), req.GetStagingTargetPath()})
		case *csi.NodePublishVolumeRequest:
			calls = append(calls, call{r.Method, req.GetVolumeId(), req.GetStagingTargetPath()})
		case *csi.NodeUnstageVolumeRequest:
			calls = append(calls, call{r.Method, req.GetVolumeId(), req.GetStagingTargetPath()})
		}
	}
	wantCalls := []call{
		{"NodeStageVolume", "handle-a", want[nameA]},
		{"NodePublishVolume", "handle-a", want[nameA]},
		{"NodeUnstageVolume", "handle-b", want[nameB]},
		{"NodeUnstageVolume", "handle-a", want[nameA]},
	}
	if !slices.Equal(calls, wantCalls) {
		t.Errorf("driver calls =\n%v\nwant\n%v", calls, wantCalls)
	}
	for _, dir := range []string{legacyA, legacyB, podDirA} {
		if _, err := os.Lstat(dir); !os.IsNotExist(err) {
			t.Errorf("%s left behind: %v", dir, err)
		}
	}
	for _, h := range []string{"handle-a", "handle-b"} {
		if dir, _ := ondisk.StagingDir(root, drv.DriverName(), h); exists(dir) {
			t.Errorf("%s was created: a legacy volume is staged where it was", dir)
		}
	}
	if fi, err := os.Lstat(filepath.Dir(legacyA)); err != nil || !fi.IsDir() {
		t.Errorf("%s: %v, want it kept", filepath.Dir(legacyA), err)
	}
}

// oldKubeletStaged lays out what an older kubelet left for a staged
// volume: pv/{pvName}/globalmount and vol_data.json (driver and handle
// only); it returns the directory.
func oldKubeletStaged(t *testing.T, root, pvName, driver, handle string) string {
	t.Helper()
	dir, err := ondisk.LegacyStagingDir(root, pvName)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "globalmount"), 0o750); err != nil {
		t.Fatal(err)
	}
	writeJSON(t, filepath.Join(dir, ondisk.VolumeDataFile), map[string]string{"driverName": driver, "volumeHandle": handle})
	return dir
}

func writeJSON(t *testing.T, file string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, b, 0o640); err != nil {
		t.Fatal(err)
	}
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}
