package volumemanager

import (
	"errors"

	"github.com/nodevol/nodevol/volumemanager/internal/planner"
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

// ErrReadWriteOncePod is wrapped by the error of a pod refused a
// ReadWriteOncePod volume that another pod on the node uses.
var ErrReadWriteOncePod = planner.ErrReadWriteOncePod

// SELinuxConflictError is the error of a pod that would mount a volume with
// another SELinux context than a pod that already uses it (the kubelet's
// "conflicting SELinux labels of volume"). The pod waits until the other
// pods are gone; they are not touched.
type SELinuxConflictError = planner.SELinuxConflictError

// marked is err, also matching mark (errors.Is), with err's text.
type marked struct{ err, mark error }

func (e marked) Error() string   { return e.err.Error() }
func (e marked) Unwrap() []error { return []error{e.err, e.mark} }
