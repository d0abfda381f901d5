package planner

import (
	"errors"
	"time"
)

// ErrUnknownSource is wrapped by the resolution error of a volume whose
// source nodevol cannot mount: final at once, only a new pod changes it.
var ErrUnknownSource = errors.New("volume has no CSI, PVC or migrated in-tree source")

// ErrClaimPending is wrapped by the resolution error of a claim that is
// missing or not bound: final once it lasts the grace period Finality is
// given.
var ErrClaimPending = errors.New("claim pending")

// PendingClaimError is a claim missing or not bound, since when the loop
// first saw that pod volume in that state.
type PendingClaimError struct {
	Err   error
	Since time.Time
}

func (e *PendingClaimError) Error() string { return e.Err.Error() }
func (e *PendingClaimError) Unwrap() error { return e.Err }

// Finality says whether a volume's error is final at now, and if not,
// when it will be (zero: it may resolve, never final by waiting). An
// unknown source, a ReadWriteOncePod refusal and an SELinux conflict are
// final at once; a pending claim once it has lasted grace. The other
// errors (driver not registered, attach in progress, an operation failing
// with backoff, API errors) may resolve: the wait goes on.
func Finality(err error, now time.Time, grace time.Duration) (final bool, at time.Time) {
	var pending *PendingClaimError
	var conflict *SELinuxConflictError
	switch {
	case err == nil:
		return false, time.Time{}
	case errors.Is(err, ErrUnknownSource), errors.Is(err, ErrReadWriteOncePod), errors.As(err, &conflict):
		return true, time.Time{}
	case errors.As(err, &pending):
		at := pending.Since.Add(grace)
		return !now.Before(at), at
	}
	return false, time.Time{}
}
