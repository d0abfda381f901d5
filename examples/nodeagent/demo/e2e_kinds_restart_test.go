package main

import (
	"context"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// gonePod is a pod with an emptyDir on disk ("scratch"), an emptyDir in
// memory ("mem") and a claim of its own local PV ("local"), with subPath
// mounts of the emptyDir and of the local volume.
type gonePod struct {
	pod      *v1.Pod
	localPV  string
	localDir string
	subs     []subPathMount
}

func (e *kindsEnv) newGonePod(name string) *gonePod {
	g := &gonePod{localPV: "local-" + name, localDir: filepath.Join(e.host, "local-"+name)}
	e.localClaim(g.localPV, g.localDir, kindsNode)
	g.pod = kindsPod(name,
		emptyDirVolume("scratch", v1.StorageMediumDefault, ""),
		emptyDirVolume("mem", v1.StorageMediumMemory, "64Mi"),
		claimVolume("local", g.localPV))
	g.subs = []subPathMount{
		{"scratch", "sub/gone", withSubPath(g.pod, "scratch", "sub/gone")},
		{"local", "sub/gone", withSubPath(g.pod, "local", "sub/gone")},
	}
	return g
}

// mounts are the pod's mounts under the root, its subPath mounts too.
func (e *kindsEnv) goneMounts(g *gonePod) map[string]wantMount {
	scratch := e.volumePath(g.pod, "kubernetes.io~empty-dir", "scratch")
	local := e.volumePath(g.pod, "kubernetes.io~local-volume", g.localPV)
	return map[string]wantMount{
		e.volumePath(g.pod, "kubernetes.io~empty-dir", "mem"): {fstype: "tmpfs", opt: "size=65536k"},
		local: {same: g.localDir},
		e.subPathTarget(g.pod, "scratch", g.subs[0].index): {same: filepath.Join(scratch, "sub/gone")},
		e.subPathTarget(g.pod, g.localPV, g.subs[1].index): {same: filepath.Join(local, "sub/gone")},
	}
}

// goneLayout is what the pod has under the root while mounted.
func (e *kindsEnv) goneLayout(g *gonePod) []string {
	pod := "pods/" + string(g.pod.UID)
	return []string{
		pod + "/volumes/kubernetes.io~empty-dir/scratch/data",
		pod + "/volumes/kubernetes.io~empty-dir/scratch/sub/gone/data",
		pod + "/volumes/kubernetes.io~empty-dir/mem/",
		pod + "/plugins/kubernetes.io~empty-dir/scratch/ready",
		pod + "/plugins/kubernetes.io~empty-dir/mem/ready",
		pod + "/volumes/kubernetes.io~local-volume/" + g.localPV + "/",
		rel(e.root, e.subPathTarget(g.pod, "scratch", g.subs[0].index)) + "/",
		rel(e.root, e.subPathTarget(g.pod, g.localPV, g.subs[1].index)) + "/",
	}
}

// merge is the union of mount expectations.
func merge(ms ...map[string]wantMount) map[string]wantMount {
	out := map[string]wantMount{}
	for _, m := range ms {
		maps.Copy(out, m)
	}
	return out
}

// TestAllKindsRestart stops the volume manager with two pods mounted, a
// volume of every kind and subPath mounts between them, and starts a new
// one on the same root. The pod that is added again keeps every volume:
// its data, the same mounts (mount IDs: the tmpfs is not mounted again),
// and the new manager runs nothing the kubelet would not redo (no
// operation fails, nothing is unmounted, the CSI volume is neither staged
// nor published again). The pod deleted while the manager was down keeps
// its mounts until the pods are synced; then its emptyDirs (disk and
// memory), its local volume's mount and its subPath mounts go, its local
// PV's data stays, and nothing of the other pod is touched.
func TestAllKindsRestart(t *testing.T) {
	e := newKindsEnv(t, "nv-kindr-")
	vm, _, stop := e.start()
	a, g := e.newAllKinds("kept"), e.newGonePod("gone")
	e.mountAll(vm, a.pod)
	e.mountAll(vm, g.pod)
	loop := e.loopDev("mounted", true)
	e.useAll(a, loop)
	for _, name := range []string{"scratch", "mem", "local"} {
		vols := e.volumes(&allKinds{pod: g.pod, localPV: g.localPV})
		writeFile(t, filepath.Join(vols[name].path, "data"), "data of gone "+name+"\n")
	}
	e.prepareSubPaths(vm, a.pod, a.subPaths())
	e.prepareSubPaths(vm, g.pod, g.subs)
	keptMounts := e.mounts(a, loop, true)
	keptMounts[e.csiStaging()] = wantMount{fstype: "ext4", dev: loop}
	before := e.checkMounts("before the restart", merge(keptMounts, e.goneMounts(g)))
	mountedTree := append(append(e.layout(a, true), e.staged()...), e.goneLayout(g)...)
	e.checkTree("before the restart", mountedTree)
	stop()

	vm, reg, _ := e.start()
	e.mountAll(vm, a.pod)
	checkVolumes(t, vm.GetMountedVolumesForPod(a.pod.UID), e.volumes(a))
	// The local volume's bind mount is found Mounted, so the wait may end
	// before its device, which nothing on disk records, is set up again;
	// a device set up records no series of its own (the kubelet stages
	// inside volume_mount), so only a failure of it could come later, and
	// the mounts checked below would show what it undid.
	ops := opCounts(t, reg)
	t.Logf("operations after the restart: %v", ops)
	checkRedone(t, e, ops)
	e.checkSameMounts("after the restart", before, merge(keptMounts, e.goneMounts(g)))
	e.checkTree("after the restart", mountedTree)
	e.checkKeptData(a)

	vm.MarkPodsSynced()
	ctx, done := context.WithTimeout(e.ctx, time.Minute)
	defer done()
	if err := vm.WaitForUnmount(ctx, g.pod); err != nil {
		t.Fatal(err)
	}
	after := opCounts(t, reg)
	t.Logf("operations after the pods were synced: %v", after)
	if failed := failedOps(after); len(failed) > 0 {
		t.Errorf("operations failed (retried): %v", failed)
	}
	torn := map[string]uint64{}
	for k, n := range after {
		if n != ops[k] {
			torn[k] = n - ops[k]
		}
	}
	// A local PV that is a directory has no device mount on disk: the
	// restarted manager found only the pod's bind mount, which it
	// unmounts; there is nothing to unmount as a device.
	wantTorn := map[string]uint64{"kubernetes.io/empty-dir volume_unmount success": 2, "kubernetes.io/local-volume volume_unmount success": 1}
	if !maps.Equal(torn, wantTorn) {
		t.Errorf("operations once the pods were synced: %v, want %v (the gone pod's volumes torn down, nothing else)", torn, wantTorn)
	}
	e.checkSameMounts("the gone pod torn down", before, keptMounts)
	e.checkTree("the gone pod torn down", append(append(e.layout(a, true), e.staged()...), e.skeleton(g.pod, false)...))
	e.checkKeptData(a)
	checkFile(t, "the gone pod's local PV", filepath.Join(g.localDir, "data"), "data of gone local\n")
	checkFile(t, "the gone pod's local PV", filepath.Join(g.localDir, "sub/gone/data"), "subPath data of local\n")

	deletePods(t, e.ctx, vm, []*v1.Pod{a.pod})
	if err := waitUnstaged(e.ctx, vm); err != nil {
		t.Fatal(err)
	}
	e.checkMounts("all deleted", nil)
	e.loopDev("all deleted", false)
	e.checkTree("all deleted", append(append(e.skeleton(a.pod, true), e.skeleton(g.pod, false)...), e.unstaged()...))
}

// checkRedone checks the operations a restarted manager ran for a pod
// added again: none failed, none unmounted anything, and the CSI volume,
// recorded as staged and published on this boot with its mounts in place,
// was neither staged nor published again. What is left is the set-up of
// the volumes nothing on disk records as done (the kubelet sets up every
// reconstructed volume again), each at most once.
func checkRedone(t *testing.T, e *kindsEnv, ops map[string]uint64) {
	t.Helper()
	for k, n := range ops {
		switch {
		case !strings.HasSuffix(k, " success"):
			t.Errorf("after the restart: %s x%d: an operation failed", k, n)
		case strings.Contains(k, "unmount"):
			t.Errorf("after the restart: %s x%d: a running pod's volume torn down", k, n)
		case strings.HasPrefix(k, "kubernetes.io/csi:"):
			t.Errorf("after the restart: %s x%d: the CSI volume set up again", k, n)
		case n > 1 && !strings.HasPrefix(k, "kubernetes.io/empty-dir "):
			t.Errorf("after the restart: %s x%d: set up more than once", k, n)
		case n > 2:
			t.Errorf("after the restart: %s x%d: the two emptyDirs set up more than once each", k, n)
		}
	}
}

// checkSameMounts checks the mounts under the root against want and that
// each is the very mount it was before (same mount ID).
func (e *kindsEnv) checkSameMounts(label string, before map[string]int, want map[string]wantMount) {
	e.t.Helper()
	now := e.checkMounts(label, want)
	for _, p := range slices.Sorted(maps.Keys(now)) {
		if now[p] != before[p] {
			e.t.Errorf("%s: %s: mount %d, was %d: mounted again", label, rel(e.root, p), now[p], before[p])
		}
	}
}

// checkKeptData checks the data useAll and prepareSubPaths wrote into the
// kept pod's volumes.
func (e *kindsEnv) checkKeptData(a *allKinds) {
	e.t.Helper()
	w := e.volumes(a)
	for _, name := range []string{"scratch", "mem", "host", "local", "data"} {
		checkFile(e.t, "kept pod", filepath.Join(w[name].path, "data"), "data of "+name+"\n")
	}
	for _, s := range a.subPaths() {
		checkFile(e.t, "kept pod's subPath", filepath.Join(w[s.volume].path, s.sub, "data"), "subPath data of "+s.volume+"\n")
	}
}
