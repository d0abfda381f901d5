package emptydir

import (
	"context"
	"path/filepath"
	"testing"

	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// TestWrapper: another plugin's volume kept in an emptyDir has the
// kubelet's layout (the plugin's volume directory, the ready file of
// wrapped_{name}), a tmpfs sized by the pod when in memory, is set up once,
// found again after a restart under the plugin's name, and torn down from
// its path alone.
func TestWrapper(t *testing.T) {
	for _, memory := range []bool{false, true} {
		fake := mount.NewFakeMounter(nil)
		root := t.TempDir()
		w, err := NewWrapper(Config{RootDir: root, Mounter: fake, AllocatableMemory: func() (int64, error) { return 8 << 30, nil }}, "secret", "kubernetes.io/secret")
		if err != nil {
			t.Fatal(err)
		}
		w.p.noswap = func() bool { return false }
		ctx := context.Background()
		pod := testPod(ctr(mem("256Mi"), nil))
		size, err := w.MemorySize(pod)
		if err != nil || size != 256<<20 {
			t.Fatalf("MemorySize = %d, %v; want the pod's limit", size, err)
		}
		vol := podvol.PodVolume{Pod: podvol.PodRef{UID: testUID, Namespace: "ns", Name: "pod"}, SpecName: "creds"}
		dir, err := w.SetUp(ctx, vol, memory, size)
		if err != nil {
			t.Fatal(err)
		}
		wantDir := filepath.Join(root, "pods", string(testUID), "volumes", "kubernetes.io~secret", "creds")
		ready := filepath.Join(root, "pods", string(testUID), "plugins", "kubernetes.io~empty-dir", "wrapped_creds", "ready")
		if _, abs, _ := w.Path(testUID, "creds"); dir != wantDir || abs != wantDir || !exists(t, ready) {
			t.Fatalf("memory %v: SetUp at %s (Path %s), ready file there: %v; want %s", memory, dir, abs, exists(t, ready), wantDir)
		}
		mps, _ := fake.List()
		if memory && (len(mps) != 1 || mps[0].Path != wantDir || mps[0].Type != "tmpfs" || mps[0].Opts[len(mps[0].Opts)-1] != "size=268435456") ||
			!memory && len(mps) != 0 {
			t.Fatalf("memory %v: mounts %+v", memory, mps)
		}
		if _, err := w.SetUp(ctx, vol, memory, size); err != nil || len(fake.GetLog()) != len(mps) {
			t.Fatalf("memory %v: second SetUp: %v, mounter log %v", memory, err, fake.GetLog())
		}
		points := map[string]bool{}
		for _, mp := range mps {
			points[mp.Path] = true
		}
		found := w.Reconstruct(ctx, volume.Recovery{MountPoints: points})
		// Uncertain even in memory: the wrapped plugin's files may be
		// half-written.
		wantState := podvol.Uncertain
		if len(found.Mounts) != 1 || string(found.Mounts[0].Spec.Name) != "kubernetes.io/secret/"+string(testUID)+"-creds" || found.Mounts[0].Spec.Plugin != "kubernetes.io/secret" || found.Mounts[0].State != wantState {
			t.Fatalf("memory %v: Reconstruct = %+v", memory, found)
		}
		if err := w.TearDown(ctx, testUID, "creds"); err != nil {
			t.Fatal(err)
		}
		if mps, _ := fake.List(); len(mps) != 0 || exists(t, wantDir) || exists(t, filepath.Dir(ready)) {
			t.Fatalf("memory %v: after TearDown: mounts %v, directory there %v, ready directory there %v", memory, mps, exists(t, wantDir), exists(t, filepath.Dir(ready)))
		}
	}
}
