package volumemanager

import (
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/mount-utils"
)

// TestRestartHoldsWhileClaimsUnread: after a restart in object-cache mode
// (the default), while every GET of a claim fails, pod a is added again
// and pod b is not (deleted while the node agent was down). Pod a cannot
// be resolved: its claim is not known, which is not the claim missing, so
// it may want any volume found on disk. Nothing found is torn down then,
// not even b's volume, although MarkPodsSynced has been called (with
// informers their failed list holds it the same way). Once the claims
// answer, a keeps its volume without a call and b's is unpublished and
// unstaged.
func TestRestartHoldsWhileClaimsUnread(t *testing.T) {
	e := newRestartEnv(t)
	var failing atomic.Bool
	var failed atomic.Int32
	failing.Store(true)
	e.client.PrependReactor("get", "persistentvolumeclaims", func(clienttesting.Action) (bool, runtime.Object, error) {
		if !failing.Load() {
			return false, nil, nil
		}
		failed.Add(1)
		return true, nil, apierrors.NewInternalError(errors.New("the API server fails"))
	})
	// The fake mounter shows a's mounts (the in-process driver makes
	// none); b's, with no mount point, is Uncertain: torn down once no
	// pod may want it.
	m := mount.NewFakeMounter([]mount.MountPoint{
		{Path: filepath.Join(e.dirA, "mount"), Device: "/dev/a", Type: "ext4"},
		{Path: e.stagingPathA, Device: "/dev/a", Type: "ext4"},
	})
	before := e.calls()
	vm, stop := startVMBoot(t, e.client, e.root, e.drv, m, e.boot)
	defer stop()
	vm.AddPod(e.podA)
	vm.MarkPodsSynced()
	eventually(t, "pod a's claim read and failed, the loop idle", func() bool { return failed.Load() > 0 && vm.idle() })
	if got := e.callsSince(before); len(got) != 0 {
		t.Errorf("CSI calls while pod a's claim cannot be read = %v, want none: nothing found on disk may be torn down while a pod cannot be resolved", got)
	}
	if !vm.HasPossiblyMountedVolumesForPod(e.podB.UID) {
		t.Error("pod b's volume is not possibly mounted while pod a's claim cannot be read, want it held")
	}

	failing.Store(false) // the object cache reads it again after its backoff
	e.keepsAOnly(t, vm, before, "once the claims answer")
}
