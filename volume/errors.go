package volume

import (
	"errors"
	"fmt"
)

// Error classes. Plugins wrap their errors with these sentinels (errors.Is).
var (
	// ErrInProgress: the operation may have started and may still finish
	// (gRPC Canceled, DeadlineExceeded, Unavailable, ResourceExhausted,
	// Aborted, or a transport failure). The volume becomes Uncertain.
	ErrInProgress = errors.New("operation may still be in progress")
	// ErrNotReady: something the operation waits for is not there yet (a
	// VolumeAttachment not attached, a driver not registered). Nothing was
	// changed; retried with backoff and when the world changes.
	ErrNotReady = errors.New("not ready")
	// ErrInUse: an unstage was refused because mounts still reference the
	// staged device (see InUseError). Nothing was changed.
	ErrInUse = errors.New("device is still in use")
	// ErrNoPlugin: no registered plugin handles the volume (Registry).
	ErrNoPlugin = errors.New("no volume plugin handles it")
	// ErrInfeasible: the plugin refuses the request as it stands, and
	// asking again cannot succeed until the request changes (a node
	// expansion to a size the driver cannot give: CSI InvalidArgument,
	// OutOfRange, NotFound). Nothing was changed.
	ErrInfeasible = errors.New("request refused as infeasible")
	// ErrNotWhileInUse: the plugin cannot do the operation while the
	// volume is published or staged (a node expansion that the volume's
	// filesystem allows only offline: CSI FailedPrecondition). Nothing
	// was changed.
	ErrNotWhileInUse = errors.New("cannot be done while the volume is in use")
)

// InUseError is the error of an unstage refused because other mounts
// reference the staging path, as the kubelet's UnmountDevice refuses
// while GetDeviceMountRefs finds any. errors.Is(err, ErrInUse) holds.
type InUseError struct {
	// Path is the staging path.
	Path string
	// Refs are the mount points that reference it.
	Refs []string
}

func (e *InUseError) Error() string {
	return fmt.Sprintf("staging path %s is still referenced by %d mount(s): %v", e.Path, len(e.Refs), e.Refs)
}

// Is makes errors.Is(err, ErrInUse) true.
func (e *InUseError) Is(target error) bool { return target == ErrInUse }

// IsUncertain reports whether err means the operation may have half-happened.
func IsUncertain(err error) bool { return errors.Is(err, ErrInProgress) }

// AttachLimitError is the error of a volume whose VolumeAttachment the
// attacher could not attach because the node has reached the driver's
// attach limit: status.attachError.errorCode ResourceExhausted, for a
// driver whose CSIDriver sets nodeAllocatableUpdatePeriodSeconds (the
// kubelet's VerifyExhaustedResource). For other drivers that error is a
// plain attach error.
type AttachLimitError struct {
	// Volume describes the volume (unique name, PV and driver).
	Volume string
	// Node is the node the volume was to be attached to.
	Node string
	// Driver is the CSI driver.
	Driver string
	// VolumeAttachment is the name of the VolumeAttachment.
	VolumeAttachment string
	// Message is the attacher's status.attachError.message.
	Message string
}

func (e *AttachLimitError) Error() string {
	return fmt.Sprintf("attaching volume %s to node %s failed (VolumeAttachment %s): the node has reached the attach limit of driver %s (ResourceExhausted): %s",
		e.Volume, e.Node, e.VolumeAttachment, e.Driver, e.Message)
}

// KubeletCause is the kubelet's words for the failure: the attacher's
// message, as the kubelet's WaitForAttach returns it.
func (e *AttachLimitError) KubeletCause() string { return e.Message }
