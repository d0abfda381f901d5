package reconciler

import (
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/internal/duequeue"
	"github.com/nodevol/nodevol/podvol"
)

// What the manager's run loop and its waits read of the loop. The run loop
// calls SetLogger, Pending and Retries on the loop's goroutine; the rest
// lock and may be called from any goroutine.

// SetLogger sets the logger of the loop's lines (Run's).
func (l *Loop) SetLogger(logger klog.Logger) { l.logger = logger }

// Pending reports whether volumes wait to be planned now.
func (l *Loop) Pending() bool { return l.queue.len() > 0 }

// Retries is the queue of the volumes' backoff ends: the run loop arms
// its timer for the earliest and calls Due when it fires.
func (l *Loop) Retries() *duequeue.Queue[podvol.UniqueVolumeName] { return l.queue.retries }

// Running returns one operation in flight of each volume that has one:
// the one on the whole volume, else the one that started first.
func (l *Loop) Running() map[podvol.UniqueVolumeName]RunningOp { return l.running.all() }

// RunningOf returns the operation that a pod's use of a volume waits for:
// one on the pod's mount of it, else one on the whole volume.
func (l *Loop) RunningOf(name podvol.UniqueVolumeName, uid types.UID) (RunningOp, bool) {
	return l.running.of(name, uid)
}

// VolumeNotes returns why a volume waits and its last volume-level error,
// for WaitForUnstaged's error.
func (l *Loop) VolumeNotes(name podvol.UniqueVolumeName) ([]string, error) { return l.notes.get(name) }

// PodErrors returns the last error of each of the pod's volumes, by spec
// name: an operation's or a refusal's (not its resolution's).
func (l *Loop) PodErrors(uid types.UID) map[string]error { return l.errs.get(uid) }

// PodErrorsChanged returns a channel closed when the pod's errors change
// or are judged anew; give it back with PodErrorsWaitDone.
func (l *Loop) PodErrorsChanged(uid types.UID) <-chan struct{} { return l.errs.changed(uid) }

// PodErrorsWaitDone gives back a channel of PodErrorsChanged.
func (l *Loop) PodErrorsWaitDone(uid types.UID, ch <-chan struct{}) { l.errs.waitDone(uid, ch) }
