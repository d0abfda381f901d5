package fsgroup

import (
	"context"
	"fmt"
	"os"
	"strings"
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

// DefaultReportEvery is how often an ownership change that runs long is
// reported again, with the files done so far: the kubelet's minute.
const DefaultReportEvery = time.Minute

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
	// WarnAfter is how long a change runs before it is reported.
	// Default DefaultWarnAfter.
	WarnAfter time.Duration
	// ReportEvery is how often it is reported again after that, with the
	// files done so far. Default DefaultReportEvery.
	ReportEvery time.Duration
	// Events, if set, gets a reasonChangeInProgress event on the pod.
	// Default: none (the warning is only logged).
	Events record.EventRecorder
	// EachFile, if set, is called before each file's ownership is changed
	// (tests hold the walk with it).
	EachFile func(path string)
}

// Change gives req.GID ownership of req.Dir (setIn). When that runs longer
// than WarnAfter, it logs a warning and records a
// VolumePermissionChangeInProgress event on the pod, then again every
// ReportEvery with the files done so far, in the kubelet's words: a volume
// with many files can keep a pod from starting for a long time, and the
// event tells its owner why and what avoids it. A change that ran is told
// to ctx's Observer (WithObserver). It returns only once the
// reporting goroutine has ended.
func (r Reporter) Change(ctx context.Context, req Request) error {
	c, after, every := r.Clock, r.WarnAfter, r.ReportEvery
	if c == nil {
		c = clock.RealClock{}
	}
	if after <= 0 {
		after = DefaultWarnAfter
	}
	if every <= 0 {
		every = DefaultReportEvery
	}
	dir := dirToReport(req.Dir.Name(), string(req.Pod.UID))
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
		logger := klog.FromContext(ctx).WithValues("pod", klog.KRef(req.Pod.Namespace, req.Pod.Name), "volume", req.Volume, "path", req.Dir.Name(), "fsGroup", req.GID)
		logger.Info("Changing the ownership of a volume to the pod's fsGroup is taking long; fsGroupChangePolicy OnRootMismatch would skip it when the volume's root already has the group",
			"after", after, "files", files.Load())
		r.event(&req.Pod, fmt.Sprintf("Setting volume ownership for %s is taking longer than expected, consider using OnRootMismatch - "+
			"https://kubernetes.io/docs/tasks/configure-pod-container/security-context/#configure-volume-permission-and-ownership-change-policy-for-pods", dir))
		again := c.NewTimer(every)
		defer again.Stop()
		for {
			select {
			case <-done:
				return
			case <-again.C():
			}
			n := files.Load()
			logger.Info("Still changing the ownership of a volume to the pod's fsGroup", "files", n)
			r.event(&req.Pod, fmt.Sprintf("Setting volume ownership for %s, processed %d files.", dir, n))
			again.Reset(every)
		}
	})
	skipped := req.OnRootMismatch && rootHasOwnership(req.Dir, req.GID) // setIn skips it too
	start := c.Now()
	err := setIn(ctx, req.Dir, req.GID, req.OnRootMismatch, func(path string) {
		files.Add(1)
		if r.EachFile != nil {
			r.EachFile(path)
		}
	})
	timer.Stop()
	close(done)
	wg.Wait()
	if !skipped {
		Observe(ctx, c.Since(start), err)
	}
	return err
}

// event records a reasonChangeInProgress event with msg on pod, if
// there is a recorder.
func (r Reporter) event(pod *v1.ObjectReference, msg string) {
	if r.Events != nil {
		r.Events.Event(pod, v1.EventTypeWarning, reasonChangeInProgress, msg)
	}
}

// dirToReport is how the kubelet names the volume's directory path in its
// events: from the pod's UID on ("{uid}/volumes/kubernetes.io~csi/pv/mount"),
// or the whole path when it does not hold the UID.
func dirToReport(path, podUID string) string {
	if i := strings.Index(path, podUID); podUID != "" && i >= 0 {
		return path[i:]
	}
	return path
}
