package volumemanager

import (
	"errors"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// ErrFinal is matched (errors.Is) by the *WaitError of a wait that
// returned before its deadline because the pod's errors will not go away
// by waiting: a claim missing or not bound for longer than
// Config.ClaimPendingGracePeriod, a volume refused to the pod
// (ReadWriteOncePod, SELinux context: until the pod that holds the volume
// is gone), a volume source nodevol cannot mount, a pod bound to another
// node. Like the kubelet's pod worker, a caller asks again on its next
// sync of the pod: a claim bound or a holder gone since lets that wait
// succeed. A wait that ran out of time matches the context's error instead
// (context.DeadlineExceeded).
var ErrFinal = errors.New("the pod's volume errors will not resolve by waiting: a change to the pod, its claims or the pods holding its volumes is needed")

// errUnknownSource is wrapped by the resolution error of a volume whose
// source nodevol cannot mount: final at once, only a new pod changes it.
var errUnknownSource = errors.New("volume has no CSI, PVC or migrated in-tree source")

// errClaimPending is wrapped by the resolution error of a claim that is
// missing or not bound: final once it lasts Config.ClaimPendingGracePeriod.
var errClaimPending = errors.New("claim pending")

// pendingClaimError is a claim missing or not bound, since when the loop
// first saw that pod volume in that state.
type pendingClaimError struct {
	err   error
	since time.Time
}

func (e *pendingClaimError) Error() string { return e.err.Error() }
func (e *pendingClaimError) Unwrap() error { return e.err }

// stampPending wraps the pod's claim-pending errors with the time each was
// first seen for that pod volume; a volume that resolved, or failed
// otherwise, starts over. The loop calls it at each resolution of the pod.
func (l *loop) stampPending(uid types.UID, errs map[string]error) {
	old := l.pendingSince[uid]
	var now map[string]time.Time // nil for the usual pod: nothing pending, nothing allocated
	for name, err := range errs {
		if !errors.Is(err, errClaimPending) {
			continue
		}
		since, ok := old[name]
		if !ok {
			since = l.clock.Now()
		}
		if now == nil {
			now = map[string]time.Time{}
		}
		now[name] = since
		errs[name] = &pendingClaimError{err: err, since: since}
	}
	if now == nil {
		delete(l.pendingSince, uid)
		return
	}
	if l.pendingSince == nil {
		l.pendingSince = map[types.UID]map[string]time.Time{}
	}
	l.pendingSince[uid] = now
}

// finality says whether a volume's error is final at now, and if not,
// when it will be (zero: it may resolve, never final by waiting). The
// other errors (driver not registered, attach in progress, an operation
// failing with backoff, API errors) may resolve: the wait goes on.
func finality(err error, now time.Time, grace time.Duration) (final bool, at time.Time) {
	var pending *pendingClaimError
	var conflict *SELinuxConflictError
	switch {
	case err == nil:
		return false, time.Time{}
	case errors.Is(err, errUnknownSource), errors.Is(err, ErrReadWriteOncePod), errors.As(err, &conflict):
		return true, time.Time{}
	case errors.As(err, &pending):
		at := pending.since.Add(grace)
		return !now.Before(at), at
	}
	return false, time.Time{}
}

// marked is err, also matching mark (errors.Is), with err's text.
type marked struct{ err, mark error }

func (e marked) Error() string   { return e.err.Error() }
func (e marked) Unwrap() []error { return []error{e.err, e.mark} }
