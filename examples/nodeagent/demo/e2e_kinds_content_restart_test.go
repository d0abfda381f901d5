package main

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// TestAllKindsContentRestart stops the volume manager with two content
// pods mounted, updates the configMap settings, the secret and one pod's
// labels while it is down, and starts a new one on the same root. The pod
// added again keeps its secret, downwardAPI and projected tmpfs mounts
// (the same mount IDs: adopted, not mounted again) and its volumes are
// published again at once, as the kubelet remounts a pod's volumes at its
// first sync: the configMap volume that reads settings, the secret, the
// labels file show the changes, and the kube-api-access volume a new token
// (the token cache is in memory, the kubelet's too), in new versions; the
// configMap volume of kube-root-ca.crt, unchanged, is not written again;
// nothing is unmounted and nothing fails.
// The pod deleted while the manager was down keeps its mounts until the
// pods are synced; then its tmpfs mounts, volume directories and ready
// files go, and nothing of the other pod is touched.
func TestAllKindsContentRestart(t *testing.T) {
	e := newKindsEnv(t, "nv-kindcr-")
	e.resync = time.Hour // what lands, lands at the pod's first sync
	tokens := e.contentObjects()
	vm, _, stop := e.start()
	kept, gone := newContentPod("kept"), newContentPod("gone")
	e.mountAll(vm, kept)
	e.mountAll(vm, gone)
	var keptV, goneV contentVersions
	e.checkContent("before the restart", kept, contentFiles("1", "hunter2", contentLabels, "token-1"), &keptV)
	e.checkContent("before the restart", gone, contentFiles("1", "hunter2", contentLabels, "token-2"), &goneV)
	bothMounts := merge(e.contentMounts(kept), e.contentMounts(gone))
	before := e.checkMounts("before the restart", bothMounts)
	stop()

	e.updateConfigMap("settings", settingsData("2"))
	e.updateSecret("correct horse")
	kept.Labels["tier"] = "back"
	labels := "app=\"web\"\ntier=\"back\""
	vm, reg, _ := e.start()
	e.mountAll(vm, kept)
	checkVolumes(t, vm.GetMountedVolumesForPod(kept.UID), e.contentVolumes(kept))
	// The adopted volumes are Mounted at once; their new content follows.
	for _, w := range []struct{ volume, file, data string }{
		{"conf", "etc/version", "2"}, {"creds", "password", "correct horse"}, {"info", "labels", labels}, {contentAccess, "token", "token-3"},
	} {
		e.waitContent(kept, w.volume, w.file, w.data)
	}
	var ops map[string]uint64
	waitFor(t, "the adopted volumes' set-ups counted", time.Minute, func() bool {
		ops = opCounts(t, reg)
		return ops["kubernetes.io/configmap volume_mount success"] >= 2 && ops["kubernetes.io/secret volume_mount success"] >= 1 &&
			ops["kubernetes.io/downward-api volume_mount success"] >= 1 && ops["kubernetes.io/projected volume_mount success"] >= 1
	})
	t.Logf("operations after the restart: %v", ops)
	for k, n := range ops {
		if !strings.HasSuffix(k, " success") || strings.Contains(k, "unmount") {
			t.Errorf("after the restart: %s x%d: an operation failed, or a running pod's volume was torn down", k, n)
		}
	}
	e.checkSameMounts("after the restart", before, bothMounts)
	was := maps.Clone(keptV.current)
	restarted := e.checkContent("after the restart", kept, contentFiles("2", "correct horse", labels, "token-3"), &keptV)
	e.checkRewritten("after the restart", was, restarted, "conf", "creds", "info", contentAccess)
	goneWas := maps.Clone(goneV.current)
	goneNow := e.checkContent("the gone pod after the restart", gone, contentFiles("1", "hunter2", contentLabels, "token-2"), &goneV)
	e.checkRewritten("the gone pod after the restart", goneWas, goneNow) // untouched
	e.checkTree("after the restart", slices.Concat(e.contentLayout(kept, keptV.replaced), e.contentLayout(gone, goneV.replaced)))

	vm.MarkPodsSynced()
	ctx, done := context.WithTimeout(e.ctx, time.Minute)
	defer done()
	if err := vm.WaitForUnmount(ctx, gone); err != nil {
		t.Fatal(err)
	}
	torn := map[string]uint64{}
	for k, n := range opCounts(t, reg) {
		if n != ops[k] && !strings.HasSuffix(k, " volume_mount success") { // the kept pod's republishes
			torn[k] = n - ops[k]
		}
	}
	wantTorn := map[string]uint64{"kubernetes.io/configmap volume_unmount success": 2, "kubernetes.io/secret volume_unmount success": 1,
		"kubernetes.io/downward-api volume_unmount success": 1, "kubernetes.io/projected volume_unmount success": 1}
	if !maps.Equal(torn, wantTorn) {
		t.Errorf("operations once the pods were synced: %v, want %v (the gone pod's volumes torn down, nothing else)", torn, wantTorn)
	}
	e.checkSameMounts("the gone pod torn down", before, e.contentMounts(kept))
	now := e.checkContent("the gone pod torn down", kept, contentFiles("2", "correct horse", labels, "token-3"), &keptV)
	e.checkRewritten("the gone pod torn down", restarted, now)
	e.checkTree("the gone pod torn down", slices.Concat(e.contentLayout(kept, keptV.replaced), contentSkeleton(gone)))
	issued := tokens.issued()
	checkTokenRequests(t, issued[2:], kept)

	deletePods(t, e.ctx, vm, []*v1.Pod{kept})
	e.checkMounts("all deleted", nil)
	e.checkTree("all deleted", slices.Concat(contentSkeleton(kept), contentSkeleton(gone)))
}
