package agent

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/volumemanager"
)

// podDirs is what removing a gone pod's directory needs of the volume
// manager.
type podDirs interface {
	DeletePod(pod *v1.Pod)
	WaitForUnmount(ctx context.Context, pod *v1.Pod) error
	CleanupPodDir(ctx context.Context, uid types.UID) error
}

var _ podDirs = (*volumemanager.VolumeManager)(nil)

// podDirRetry is how long podGone waits before it asks again while the
// manager says the pod's directory may still be in use (a volume still
// mounted, a teardown failing): doubling from first to last.
type podDirRetry struct {
	first, last time.Duration
	// after is time.After; tests replace it.
	after func(time.Duration) <-chan time.Time
}

var defaultPodDirRetry = podDirRetry{first: time.Second, last: time.Minute, after: time.After}

// podGone gives the volumes of pod, deleted from the API, back
// (DeletePod) and, once they are unmounted, removes its directory
// {root}/pods/{uid} with vm.CleanupPodDir, as the kubelet's housekeeping
// removes an orphaned pod's directory: never across a mount, and keeping
// what may hold data. It returns when the directory is gone, when
// CleanupPodDir has kept something (logged once: someone must look at
// it), or when ctx ends. It blocks: run it in a goroutine of its own.
func podGone(ctx context.Context, vm podDirs, pod *v1.Pod, retry podDirRetry) {
	vm.DeletePod(pod)
	logger := klog.FromContext(ctx)
	delay := retry.first
	for {
		err := vm.WaitForUnmount(ctx, pod)
		if err == nil {
			err = vm.CleanupPodDir(ctx, pod.UID)
		}
		switch {
		case err == nil:
			logger.V(2).Info("Pod directory removed", "pod", klog.KObj(pod), "podUID", pod.UID)
			return
		case ctx.Err() != nil:
			return
		case !errors.Is(err, volumemanager.ErrPodDirInUse) && !errors.Is(err, context.DeadlineExceeded):
			logger.Error(err, "Pod directory kept", "pod", klog.KObj(pod), "podUID", pod.UID)
			return
		}
		logger.V(4).Info("Pod directory still in use", "pod", klog.KObj(pod), "podUID", pod.UID, "err", err, "retryAfter", delay)
		select {
		case <-retry.after(delay):
		case <-ctx.Done():
			return
		}
		delay = min(2*delay, retry.last)
	}
}

// sweepOrphans removes the directory of every pod under {rootDir}/pods
// that known (the pod informer's store, synced) does not have: the pods
// deleted while the agent was down, whose Delete event it never saw, as
// the kubelet's housekeeping removes orphaned pod directories. Each goes
// as podGone, in a goroutine of its own: once the volumes found on disk
// for it are torn down (after MarkPodsSynced), never across a mount. Call
// it after MarkPodsSynced; it returns once the goroutines are started,
// with the pods they remove.
func sweepOrphans(ctx context.Context, vm podDirs, rootDir string, known func(types.UID) bool, retry podDirRetry) []types.UID {
	entries, err := os.ReadDir(filepath.Join(rootDir, "pods"))
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			klog.FromContext(ctx).Error(err, "Cannot look for the directories of pods deleted while the agent was down")
		}
		return nil
	}
	var gone []types.UID
	for _, e := range entries {
		uid := types.UID(e.Name())
		if !e.IsDir() || known(uid) {
			continue
		}
		klog.FromContext(ctx).V(2).Info("Removing the directory of a pod gone while the agent was down", "podUID", uid)
		go podGone(ctx, vm, &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: uid}}, retry)
		gone = append(gone, uid)
	}
	return gone
}
