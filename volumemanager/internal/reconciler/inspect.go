package reconciler

import (
	"maps"
	"slices"

	"github.com/nodevol/nodevol/podvol"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
)

// What the manager's tests read of the loop, on its goroutine (the
// manager's inspect channel) unless said otherwise.

// Resyncs returns how many periodic resyncs the loop has made.
func (l *Loop) Resyncs() int { return l.resyncs }

// Backoff returns the backoff entries of a volume's operations.
func (l *Loop) Backoff(name podvol.UniqueVolumeName) map[oe.Key]*oe.BackoffEntry {
	return l.backoff.Volume(name)
}

// Unreadable returns, sorted, the pod volume directories found unreadable
// at start that are still there.
func (l *Loop) Unreadable() []string { return slices.Sorted(maps.Values(l.unreadable)) }

// PodErrorWaiters returns how many pods have a channel of
// PodErrorsChanged not given back; it locks.
func (l *Loop) PodErrorWaiters() int {
	l.errs.mu.Lock()
	defer l.errs.mu.Unlock()
	return l.errs.waiters.Len()
}

// ClaimPosted reports whether a change of claim key ("namespace/name")
// waits in the inbox; it locks.
func (in *Inbox) ClaimPosted(key string) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	_, ok := in.claims[key]
	return ok
}
