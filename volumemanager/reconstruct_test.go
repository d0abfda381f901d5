package volumemanager

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// recovery is what the tests compare the records found on disk with.
type recovery = volume.Recovery

// reconstruct is what Run finds on root: the CSI plugin's Reconstruct.
func reconstruct(ctx context.Context, root string, rc recovery) volume.Found {
	return newCSIPlugin(root).(volume.Reconstructor).Reconstruct(ctx, rc)
}

// startVM runs a VolumeManager on root with drv registered and returns it
// with a function that stops it and waits for Run to return.
func startVM(t *testing.T, client *fake.Clientset, root string, drv *csitest.Server) (*VolumeManager, func()) {
	t.Helper()
	return startVMWith(t, Config{NodeName: node, KubeClient: client, RootDir: root, Mounter: mount.NewFakeMounter(nil)}, drv)
}

// startVMWith is startVM with a Config of the test's.
func startVMWith(t *testing.T, cfg Config, drv *csitest.Server) (*VolumeManager, func()) {
	t.Helper()
	vm, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- vm.Run(ctx) }()
	stop := func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	if err := vm.Drivers().Register(ctx, drv.DriverName(), drv.Endpoint()); err != nil {
		stop()
		t.Fatal(err)
	}
	<-vm.ready // informers synced, the disk read
	return vm, stop
}

// waitIdle waits until the reconciler has nothing queued or running.
func waitIdle(t *testing.T, vm *VolumeManager) {
	t.Helper()
	eventually(t, "reconcile loop idle", func() bool { return vm.idle() })
}

// TestRestartReconstructs stops a volume manager with two pods' volumes
// mounted and starts a new one on the same root, as after a node agent
// restart. The volumes are found on disk; the pod that is added again keeps
// its volume (published again, idempotently); the volume of the pod that is
// not added is left alone until MarkPodsSynced, then torn down: unpublished,
// unstaged, its directories removed. A directory with a corrupt
// vol_data.json and data in it is left alone.
func TestRestartReconstructs(t *testing.T) {
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
	pvcA, pvA := csitest.BoundClaim("ns", "a", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-a"})
	pvcB, pvB := csitest.BoundClaim("ns", "b", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-b"})
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{}), pvcA, pvA, pvcB, pvB)
	root := t.TempDir()
	podA := csitest.Pod("ns", "a", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "a"}}})
	podB := csitest.Pod("ns", "b", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "b"}}})

	vm1, stop1 := startVM(t, client, root, drv)
	for _, p := range []*v1.Pod{podA, podB} {
		vm1.AddPod(p)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := vm1.WaitForAttachAndMount(ctx, p)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	stop1()
	// With a file in mount/: a directory that cannot hold data would be
	// removed rather than left.
	corrupt := filepath.Join(root, "pods", "junk-uid", "volumes", "kubernetes.io~csi", "junk")
	if err := os.MkdirAll(filepath.Join(corrupt, "mount"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(corrupt, "mount", "data"), []byte("data"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(corrupt, ondisk.VolumeDataFile), []byte("{garbage"), 0o640); err != nil {
		t.Fatal(err)
	}
	publishes := drv.Calls("NodePublishVolume")

	vm2, stop2 := startVM(t, client, root, drv)
	defer stop2()
	nameA, nameB := podvol.CSIVolumeName(drv.DriverName(), "handle-a"), podvol.CSIVolumeName(drv.DriverName(), "handle-b")
	if got := knownVolumes(vm2); !slices.Equal(got, []podvol.UniqueVolumeName{nameA, nameB}) {
		t.Fatalf("volumes in use after the restart = %v, want both", got)
	}
	vm2.AddPod(podA)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := vm2.WaitForAttachAndMount(ctx, podA); err != nil {
		t.Fatal(err)
	}
	if got := drv.Calls("NodePublishVolume"); got != publishes+1 {
		t.Errorf("NodePublishVolume calls after the restart = %d, want 1 (the re-added pod's uncertain mount)", got-publishes)
	}
	waitIdle(t, vm2)
	if got := drv.PublishedVolumes()["handle-b"]; len(got) != 1 {
		t.Fatalf("before MarkPodsSynced the unclaimed volume was torn down: published at %v", got)
	}
	if got := drv.Calls("NodeUnpublishVolume") + drv.Calls("NodeUnstageVolume"); got != 0 {
		t.Fatalf("%d teardown calls before MarkPodsSynced, want 0", got)
	}
	if !vm2.HasPossiblyMountedVolumesForPod(podB.UID) || len(vm2.GetMountedVolumesForPod(podB.UID)) != 0 {
		t.Errorf("pod b's reconstructed volume: possibly mounted %v, mounted %v; want Uncertain",
			vm2.HasPossiblyMountedVolumesForPod(podB.UID), vm2.GetMountedVolumesForPod(podB.UID))
	}

	vm2.MarkPodsSynced()
	if err := vm2.WaitForUnmount(ctx, podB); err != nil {
		t.Fatal(err)
	}
	eventually(t, "pod b's volume unstaged", func() bool {
		return slices.Equal(knownVolumes(vm2), []podvol.UniqueVolumeName{nameA})
	})
	if got := slices.Sorted(maps.Keys(drv.StagedVolumes())); !slices.Equal(got, []string{"handle-a"}) {
		t.Errorf("staged volumes = %v, want only handle-a", got)
	}
	if got := slices.Sorted(maps.Keys(drv.PublishedVolumes())); !slices.Equal(got, []string{"handle-a"}) {
		t.Errorf("published volumes = %v, want only handle-a", got)
	}
	dirB, _ := ondisk.PodVolumeDir(root, podB.UID, pvB.Name)
	stagingB, _ := ondisk.StagingDir(root, drv.DriverName(), "handle-b")
	for _, dir := range []string{dirB, stagingB} {
		if _, err := os.Lstat(dir); !os.IsNotExist(err) {
			t.Errorf("%s left behind: %v", dir, err)
		}
	}
	if _, err := os.Stat(filepath.Join(corrupt, ondisk.VolumeDataFile)); err != nil {
		t.Errorf("the unreadable volume directory was touched: %v", err)
	}
	if vols := vm2.GetMountedVolumesForPod(podA.UID); len(vols) != 1 || vols[0].State != podvol.Mounted {
		t.Errorf("pod a's volumes = %+v, want one Mounted", vols)
	}
}

// TestReconstructedSpec: what vol_data.json gives back names a volume as
// the populator does, so that a pod added again finds its volume.
func TestReconstructedSpec(t *testing.T) {
	uid := types.UID("uid-1")
	inline := csitest.Pod("ns", "p", csitest.PodSpec{UID: uid, Volumes: []csitest.PodVolume{
		{Name: "scratch", Source: v1.VolumeSource{CSI: &v1.CSIVolumeSource{Driver: "d.example.com"}}},
	}})
	tests := []struct {
		name     string
		data     ondisk.VolumeData
		dir      string
		wantName podvol.UniqueVolumeName
		wantPV   string
		wantEph  bool
	}{
		{
			name:     "persistent",
			data:     ondisk.VolumeData{SpecVolID: "pv-1", VolumeHandle: "h", DriverName: "d.example.com", VolumeLifecycleMode: "Persistent"},
			dir:      "pv-1",
			wantName: podvol.CSIVolumeName("d.example.com", "h"),
			wantPV:   "pv-1",
		},
		{
			name:     "no lifecycle mode (older kubelets): persistent",
			data:     ondisk.VolumeData{VolumeHandle: "h", DriverName: "d.example.com"},
			dir:      "pv-1",
			wantName: podvol.CSIVolumeName("d.example.com", "h"),
			wantPV:   "pv-1",
		},
		{
			name:     "inline",
			data:     ondisk.VolumeData{SpecVolID: "scratch", VolumeHandle: "csi-x", DriverName: "d.example.com", VolumeLifecycleMode: "Ephemeral"},
			dir:      "scratch",
			wantName: podvol.UniqueVolumeName(podvol.CSIPluginName + "/" + string(inline.UID) + "-" + inline.Spec.Volumes[0].Name),
			wantEph:  true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			dir, err := ondisk.PodVolumeDir(root, uid, tt.dir)
			if err != nil {
				t.Fatal(err)
			}
			data, err := json.Marshal(tt.data)
			if err != nil {
				t.Fatal(err)
			}
			writeVolData(t, dir, string(data))
			got := reconstruct(context.Background(), root, recovery{})
			if len(got.Mounts) != 1 {
				t.Fatalf("found %+v, want one pod volume", got.Mounts)
			}
			spec, vol := got.Mounts[0].Spec, got.Mounts[0].Volume
			if spec.Name != tt.wantName || spec.PVName != tt.wantPV || spec.Ephemeral != tt.wantEph {
				t.Errorf("spec = %+v, want name %s, PV %q, ephemeral %v", spec, tt.wantName, tt.wantPV, tt.wantEph)
			}
			if got := ondisk.VolumeDirName(&spec, vol); got != tt.dir {
				t.Errorf("teardown would use directory %q, want %q", got, tt.dir)
			}
			if vol.Pod.UID != uid || spec.Driver != tt.data.DriverName || spec.VolumeHandle != tt.data.VolumeHandle {
				t.Errorf("spec %+v, volume %+v do not carry the driver, handle and pod", spec, vol)
			}
		})
	}
}
