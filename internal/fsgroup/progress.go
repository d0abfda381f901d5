package fsgroup

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// DefaultWarnAfter is how long an ownership change runs before it is
// reported: the kubelet's 30 seconds.
const DefaultWarnAfter = 30 * time.Second

// reasonChangeInProgress is the reason of the event recorded on a pod
// whose volume's ownership change runs long, the kubelet's.
const reasonChangeInProgress = "VolumePermissionChangeInProgress"

// Request is the ownership change of one pod's volume.
type Request struct {
	// Dir is the volume's root, opened without following a symlink.
	Dir *os.File
	// GID is the pod's fsGroup; OnRootMismatch its fsGroupChangePolicy
	// OnRootMismatch (see setIn).
	GID            int64
	OnRootMismatch bool
	// Pod is the pod the event goes to, Volume the pod's name for the
	// volume.
	Pod    v1.ObjectReference
	Volume string
}

// Reporter changes ownership (setIn) and reports a change that runs long.
// The zero value uses the real clock and DefaultWarnAfter, and only logs.
type Reporter struct {
	// Clock times the change. Default the real clock.
	Clock clock.Clock
	// WarnAfter is how long a change runs before it is reported, once.
	// Default DefaultWarnAfter.
	WarnAfter time.Duration
	// Events, if set, gets a reasonChangeInProgress event on the pod.
	// Default: none (the warning is only logged).
	Events record.EventRecorder
	// EachFile, if set, is called before each file's ownership is changed
	// (tests hold the walk with it).
	EachFile func(path string)
}

// Change gives req.GID ownership of req.Dir (setIn). When that runs longer
// than WarnAfter, it logs a warning and records a
// VolumePermissionChangeInProgress event on the pod, once, as the kubelet
// does: a volume with many files can keep a pod from starting for a long
// time, and the event tells its owner why and what avoids it. It returns
// only once the reporting goroutine has ended.
func (r Reporter) Change(ctx context.Context, req Request) error {
	c, after := r.Clock, r.WarnAfter
	if c == nil {
		c = clock.RealClock{}
	}
	if after <= 0 {
		after = DefaultWarnAfter
	}
	var files atomic.Int64
	timer := c.NewTimer(after)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-done:
			return
		case <-timer.C():
		}
		n := files.Load()
		klog.FromContext(ctx).Info("Changing the ownership of a volume to the pod's fsGroup is taking long; fsGroupChangePolicy OnRootMismatch would skip it when the volume's root already has the group",
			"pod", klog.KRef(req.Pod.Namespace, req.Pod.Name), "volume", req.Volume, "path", req.Dir.Name(), "fsGroup", req.GID, "after", after, "files", n)
		if r.Events == nil {
			return
		}
		r.Events.Event(&req.Pod, v1.EventTypeWarning, reasonChangeInProgress, fmt.Sprintf(
			"Setting volume ownership of volume %q to fsGroup %d has taken more than %s (%d files so far); consider fsGroupChangePolicy: OnRootMismatch",
			req.Volume, req.GID, after, n))
	})
	err := setIn(ctx, req.Dir, req.GID, req.OnRootMismatch, func(path string) {
		files.Add(1)
		if r.EachFile != nil {
			r.EachFile(path)
		}
	})
	timer.Stop()
	close(done)
	wg.Wait()
	return err
}
