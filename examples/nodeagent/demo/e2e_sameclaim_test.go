package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/roottest"
	"github.com/nodevol/nodevol/volumemanager"
)

// TestEndToEndSameClaimTwice: a pod with one claim in two of its volumes
// (kubernetes#122140), on real mounts: the wait ends, both names list the
// one mount (one mount point under the pod), a file written through one
// name is there through the other; an update that drops one name keeps
// the mount and the file; deleting the pod leaves nothing.
func TestEndToEndSameClaimTwice(t *testing.T) {
	roottest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	root, drv := startE2E(t, ctx, "nv-same-", "node-1")
	client := fake.NewClientset(csitest.CSIDriver(drv.name, csitest.CSIDriverSpec{}))
	vm := runVolumeManager(t, ctx, volumemanager.Config{NodeName: "node-1", KubeClient: client, RootDir: root, Mounter: drv.mounter}, drv.name, drv.endpoint)
	if _, err := provision(ctx, client, drv, 1, "node-1"); err != nil {
		t.Fatal(err)
	}
	pod := csitest.Pod("demo", "twice", csitest.PodSpec{Node: "node-1", Volumes: []csitest.PodVolume{
		{Name: "a", Claim: "demo-0"},
		{Name: "b", Claim: "demo-0"},
	}})
	vm.AddPod(pod)
	waitCtx, done := context.WithTimeout(ctx, time.Minute)
	defer done()
	if err := vm.WaitForAttachAndMount(waitCtx, pod); err != nil {
		t.Fatal(err)
	}
	vols := vm.GetMountedVolumesForPod(pod.UID)
	if len(vols) != 2 || vols[0].SpecName != "a" || vols[1].SpecName != "b" || vols[0].Path != vols[1].Path {
		t.Fatalf("mounted volumes %+v, want a and b on one path", vols)
	}
	podDir := filepath.Join(root, "pods", string(pod.UID))
	if m, err := mountsUnder(drv.mounter, podDir); err != nil || len(m) != 1 || m[0] != vols[0].Path {
		t.Fatalf("mounts under the pod: %v %v, want only %s", m, err, vols[0].Path)
	}
	if err := os.WriteFile(filepath.Join(vols[0].Path, "through-a"), []byte("a\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	onlyB := pod.DeepCopy()
	onlyB.Spec.Volumes = onlyB.Spec.Volumes[1:]
	onlyB.Spec.Containers[0].VolumeMounts = onlyB.Spec.Containers[0].VolumeMounts[1:]
	if err := vm.UpdatePod(onlyB); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "only b listed", time.Minute, func() bool {
		v := vm.GetMountedVolumesForPod(pod.UID)
		return len(v) == 1 && v[0].SpecName == "b"
	})
	if err := vm.WaitForAttachAndMount(waitCtx, onlyB); err != nil {
		t.Fatal(err)
	}
	b := vm.GetMountedVolumesForPod(pod.UID)[0]
	if data, err := os.ReadFile(filepath.Join(b.Path, "through-a")); err != nil || string(data) != "a\n" {
		t.Fatalf("through b after a went: %q, %v", data, err)
	}
	if m, err := mountsUnder(drv.mounter, podDir); err != nil || len(m) != 1 {
		t.Fatalf("mounts under the pod after a went: %v %v, want one", m, err)
	}

	deletePods(t, ctx, vm, []*v1.Pod{onlyB})
	if err := waitUnstaged(ctx, vm); err != nil {
		t.Fatal(err)
	}
	assertClean(t, drv, root)
}
