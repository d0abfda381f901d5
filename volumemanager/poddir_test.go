package volumemanager_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/roottest"
	"github.com/nodevol/nodevol/volumemanager"
	"github.com/nodevol/nodevol/volumemanager/vmtest"
)

func emptyDirVolume(name string, medium v1.StorageMedium) csitest.PodVolume {
	return csitest.PodVolume{Name: name, Source: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{Medium: medium}}}
}

// TestCleanupPodDir: CleanupPodDir refuses, touching nothing, while the
// pod is added, while a volume of it is still mounted (its unpublish held
// in flight), and names a file left in the pod directory; once the pod is
// gone and the file too, the directory goes.
func TestCleanupPodDir(t *testing.T) {
	ctx := t.Context()
	pvc, pv := csitest.BoundClaim("ns", "data", csitest.PVSpec{Driver: csitest.DefaultDriverName, Handle: "handle-1"})
	env := vmtest.NewEnv(t, vmtest.EnvOptions{Objects: []runtime.Object{pvc, pv}})
	vm := env.Manager
	pod := csitest.Pod("ns", "web", csitest.PodSpec{Volumes: []csitest.PodVolume{
		{Name: "data", Claim: "data"},
		emptyDirVolume("cache", ""),
	}})
	podDir := filepath.Join(env.RootDir, "pods", string(pod.UID))
	if err := vm.AddPod(pod); err != nil {
		t.Fatal(err)
	}
	if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	inUse := func(what string) {
		t.Helper()
		err := vm.CleanupPodDir(ctx, pod.UID)
		if !errors.Is(err, volumemanager.ErrPodDirInUse) || !strings.Contains(err.Error(), what) {
			t.Fatalf("CleanupPodDir: %v, want ErrPodDirInUse saying %q", err, what)
		}
		if _, err := os.Stat(filepath.Join(podDir, "volumes")); err != nil {
			t.Fatalf("the pod directory was touched: %v", err)
		}
	}
	inUse("added and not deleted")

	release := make(chan struct{})
	env.Driver.Inject(csitest.Fault{Method: "NodeUnpublishVolume", Block: release, Times: 1})
	vm.DeletePod(pod)
	if err := env.Driver.WaitForCalls(ctx, "NodeUnpublishVolume", 1); err != nil {
		t.Fatal(err)
	}
	inUse(`"data"`) // the emptyDir may be torn down already, or not
	close(release)
	if err := vm.WaitForUnmount(ctx, pod); err != nil {
		t.Fatal(err)
	}

	// A mount the node's mount table shows (here the fake mounter's), of
	// which the file system says nothing: refused, nothing removed.
	stray := filepath.Join(podDir, "volumes", "kubernetes.io~empty-dir")
	if err := env.Mounter.Mount("/dev/stray", stray, "ext4", nil); err != nil {
		t.Fatal(err)
	}
	err := vm.CleanupPodDir(ctx, pod.UID)
	var kept *volumemanager.PodDirKeptError
	if !errors.As(err, &kept) || !errors.Is(err, volumemanager.ErrPodDirMountPoint) || !kept.Untouched || kept.Kept[0].Path != stray {
		t.Fatalf("CleanupPodDir with %s mounted: %v", stray, err)
	}
	if err := env.Mounter.Unmount(stray); err != nil {
		t.Fatal(err)
	}

	notes := filepath.Join(podDir, "notes.txt")
	if err := os.WriteFile(notes, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	err = vm.CleanupPodDir(ctx, pod.UID)
	if !errors.As(err, &kept) || !errors.Is(err, volumemanager.ErrPodDirNotOurs) || len(kept.Kept) != 1 || kept.Kept[0].Path != notes {
		t.Fatalf("CleanupPodDir: %v, want %s kept", err, notes)
	}
	if err := os.Remove(notes); err != nil {
		t.Fatal(err)
	}
	if err := vm.CleanupPodDir(ctx, pod.UID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(podDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("pod directory left: %v", err)
	}
	if err := vm.CleanupPodDir(ctx, pod.UID); err != nil {
		t.Fatalf("a second CleanupPodDir: %v", err)
	}
}

// TestCleanupPodDirBeforeRun: before Run has taken in what is on disk,
// nothing is known of the pods there: CleanupPodDir refuses.
func TestCleanupPodDirBeforeRun(t *testing.T) {
	root := t.TempDir()
	podDir := filepath.Join(root, "pods", "uid-1")
	if err := os.MkdirAll(filepath.Join(podDir, "volumes"), 0o750); err != nil {
		t.Fatal(err)
	}
	vm, err := volumemanager.New(volumemanager.Config{NodeName: "node-1", KubeClient: fake.NewClientset(), RootDir: root, Mounter: mount.NewFakeMounter(nil)})
	if err != nil {
		t.Fatal(err)
	}
	if err := vm.CleanupPodDir(t.Context(), "uid-1"); !errors.Is(err, volumemanager.ErrPodDirInUse) {
		t.Fatalf("CleanupPodDir before Run: %v, want ErrPodDirInUse", err)
	}
	if _, err := os.Stat(podDir); err != nil {
		t.Fatal(err)
	}
}

// TestCleanupPodDirRealMount (root): a pod with a memory emptyDir (a
// real tmpfs): refused while the pod is added, the tmpfs and its data
// intact; once the pod is deleted and unmounted, the directory goes and
// nothing is mounted under the root.
func TestCleanupPodDirRealMount(t *testing.T) {
	roottest.Require(t)
	ctx := t.Context()
	env := vmtest.NewEnv(t, vmtest.EnvOptions{Configure: func(c *volumemanager.Config) { c.Mounter = mount.New("") }})
	vm := env.Manager
	pod := csitest.Pod("ns", "mem", csitest.PodSpec{Volumes: []csitest.PodVolume{emptyDirVolume("mem", v1.StorageMediumMemory)}})
	if err := vm.AddPod(pod); err != nil {
		t.Fatal(err)
	}
	if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	vols := vm.GetMountedVolumesForPod(pod.UID)
	if len(vols) != 1 {
		t.Fatalf("mounted: %v", vols)
	}
	data := filepath.Join(vols[0].Path, "data")
	if err := os.WriteFile(data, []byte("in memory"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := vm.CleanupPodDir(ctx, pod.UID); !errors.Is(err, volumemanager.ErrPodDirInUse) {
		t.Fatalf("CleanupPodDir while mounted: %v, want ErrPodDirInUse", err)
	}
	if b, err := os.ReadFile(data); err != nil || string(b) != "in memory" {
		t.Fatalf("the volume's data: %q, %v", b, err)
	}
	if notMnt, err := mount.New("").IsLikelyNotMountPoint(vols[0].Path); err != nil || notMnt {
		t.Fatalf("the tmpfs is gone: %v, %v", notMnt, err)
	}
	vm.DeletePod(pod)
	if err := vm.WaitForUnmount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if err := vm.CleanupPodDir(ctx, pod.UID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(env.RootDir, "pods", string(pod.UID))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("pod directory left: %v", err)
	}
	mps, err := mount.New("").List()
	if err != nil {
		t.Fatal(err)
	}
	for _, mp := range mps {
		if strings.HasPrefix(mp.Path, env.RootDir+"/") {
			t.Errorf("left mounted: %s", mp.Path)
		}
	}
}
