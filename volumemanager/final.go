package volumemanager

import (
	"errors"
	"fmt"

	"github.com/nodevol/nodevol/volume"

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
// (context.DeadlineExceeded), except when the node's attach limit keeps a
// volume unattached: that wait is final too, with a
// *VolumeAttachLimitExceededError.
var ErrFinal = errors.New("the pod's volume errors will not resolve by waiting: a change to the pod, its claims or the pods holding its volumes is needed")

// ErrReadWriteOncePod is wrapped by the error of a pod refused a
// ReadWriteOncePod volume that another pod on the node uses.
var ErrReadWriteOncePod = planner.ErrReadWriteOncePod

// SELinuxConflictError is the error of a pod that would mount a volume with
// another SELinux context than a pod that already uses it (the kubelet's
// "conflicting SELinux labels of volume"). The pod waits until the other
// pods are gone; they are not touched.
type SELinuxConflictError = planner.SELinuxConflictError

// VolumeAttachmentLimitExceededReason is the reason the kubelet gives a pod
// it rejects because the node has reached a volume attachment limit (pod
// status reason, and its admission-rejection metric label).
const VolumeAttachmentLimitExceededReason = "VolumeAttachmentLimitExceeded"

// VolumeAttachLimitExceededError is the error (errors.As, through the
// *WaitError) of a WaitForAttachAndMount that ran out of time while a
// volume of the pod was not attached because the node has reached its
// driver's attach limit: the volume's VolumeAttachment has
// status.attachError.errorCode ResourceExhausted and the driver's
// CSIDriver sets nodeAllocatableUpdatePeriodSeconds (the kubelet's
// VolumeAttachLimitExceededError). The kubelet rejects such a pod (phase
// Failed, reason VolumeAttachmentLimitExceeded) so that its controller
// places a new one on a node with room: an embedder does the same, with
// Reason. The driver's CSINode allocatable count was refreshed when the
// error was seen, so the scheduler counts the node as full.
type VolumeAttachLimitExceededError struct {
	// Pod is "namespace/name".
	Pod string
	// Volume is the pod's volume (its name in the pod spec).
	Volume string
	// Driver is the volume's CSI driver.
	Driver string
	// VolumeAttachment is the name of the volume's VolumeAttachment.
	VolumeAttachment string
	// Message is the attacher's status.attachError.message.
	Message string
	// Err is the volume's attach error.
	Err *volume.AttachLimitError
}

func (e *VolumeAttachLimitExceededError) Error() string {
	return fmt.Sprintf("pod %s volume %q: %s: %v", e.Pod, e.Volume, VolumeAttachmentLimitExceededReason, e.Err)
}

// Unwrap returns the volume's attach error.
func (e *VolumeAttachLimitExceededError) Unwrap() error { return e.Err }

// Reason returns VolumeAttachmentLimitExceededReason.
func (e *VolumeAttachLimitExceededError) Reason() string { return VolumeAttachmentLimitExceededReason }

// marked is err, also matching mark (errors.Is), with err's text.
type marked struct{ err, mark error }

func (e marked) Error() string   { return e.err.Error() }
func (e marked) Unwrap() []error { return []error{e.err, e.mark} }
