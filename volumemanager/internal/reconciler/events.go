package reconciler

import (
	"errors"
	"fmt"

	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
	"github.com/nodevol/nodevol/volumemanager/internal/planner"
)

// The events of failed operations, in the kubelet v1.37.2's words
// (operation_generator.go): its reason, then "<step> for volume "<name>" :
// <cause>", the step as the kubelet's operation names the part that
// failed, the volume as the kubelet names it (eventVolumeName) and the
// cause as the kubelet words it (volume.EventCause: what the plugin
// marked, else the plugin's own text). Users, dashboards and upstream's
// conformance tests read these; nodevol's own wording, which names the
// pod, the volume, the driver and the cause, stays in the log line and in
// WaitForAttachAndMount's error.
//
// The kubelet records no event for a failed unmount, unmap, unstage or
// detach (its teardown operations have no event recorder); nodevol keeps
// one there, with the reasons older kubelets defined for them
// (FailedUnMount, FailedUnmapDevice, FailedDetachVolume) and the kubelet's
// words of its log line: a pod stuck terminating, or a device left staged,
// on a volume that will not unmount is what users look for in the events,
// and the kubelet's log is not where they look.
const (
	reasonFailedMount   = "FailedMount"            // kubelet's FailedMountVolume
	reasonFailedMap     = "FailedMapVolume"        // kubelet's FailedMapVolume
	reasonFailedAttach  = "FailedAttachVolume"     // kubelet's FailedAttachVolume (self-attach)
	reasonVolumeResize  = "VolumeResizeFailed"     // kubelet's VolumeResizeFailed (online expansion)
	reasonFailedUnmount = "FailedUnMount"          // nodevol's, as older kubelets named it
	reasonFailedUnmap   = "FailedUnmapDevice"      // nodevol's, as older kubelets named it
	reasonFailedDetach  = "FailedDetachVolume"     // nodevol's, as older kubelets named it
	reasonAttached      = "SuccessfulAttachVolume" // kubelet's, Normal (self-attach)
)

// The reasons of a node expansion's events, the kubelet's.
const (
	// ReasonFSResizeFailed: a node expansion failed.
	ReasonFSResizeFailed = "FileSystemResizeFailed"
	// ReasonFSResizeSucceeded: a node expansion grew the volume.
	ReasonFSResizeSucceeded = "FileSystemResizeSuccessful"
)

// PodObjectRef is the object a pod's events are recorded on.
func PodObjectRef(p podvol.PodRef) *v1.ObjectReference {
	return &v1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: p.Namespace, Name: p.Name, UID: p.UID}
}

// attachedEvent is the kubelet's message of a volume it attached itself
// (GenerateMsg with no detail: a space after the name, as the kubelet's
// text has it).
func attachedEvent(o oe.Outcome, p podvol.PodVolume) string {
	return fmt.Sprintf("AttachVolume.Attach succeeded for volume %q ", EventVolumeName(o, p))
}

// failedStep returns the reason of the event of failed operation o and
// the kubelet's words for the step that failed, as its event begins. A
// plugin that marked its error with volume.AtStep names another step of
// the same operation (step, when not "").
func failedStep(o oe.Outcome, step string) (reason, words string) {
	block := o.Spec.Mode == podvol.Block
	pick := func(fs, blk string) string {
		if step != "" {
			return step
		}
		if block {
			return blk
		}
		return fs
	}
	mount, unmount := reasonFailedMount, reasonFailedUnmount
	if block {
		mount, unmount = reasonFailedMap, reasonFailedUnmap
	}
	var expand *ExpandError
	var inUse *volume.InUseError
	var sub *SubPathError
	failed := o.Action.Kind.Step(o.Spec.Mode) + " failed"
	switch o.Action.Kind {
	case oe.OpAttach, oe.OpStage:
		return mount, pick(failed, failed)
	case oe.OpSelfAttach:
		return reasonFailedAttach, pick(failed, failed)
	case oe.OpPublish:
		if errors.As(o.Err, &expand) {
			// Published, then the expansion while mounting failed.
			return mount, pick("MountVolume.Setup failed while expanding volume", "MapVolume.MarkVolumeAsMounted failed while expanding volume")
		}
		return mount, pick(failed, failed)
	case oe.OpExpand:
		return reasonVolumeResize, pick(failed, failed)
	case oe.OpUnpublish:
		if errors.As(o.Err, &sub) {
			return unmount, "error cleaning subPath mounts"
		}
		return unmount, pick(failed, failed)
	case oe.OpUnstage:
		if errors.As(o.Err, &inUse) {
			return unmount, pick("GetDeviceMountRefs check failed", "UnmapDevice failed")
		}
		return unmount, pick(failed, failed)
	case oe.OpSelfDetach:
		return reasonFailedDetach, pick(failed, failed)
	}
	return "", ""
}

// EventVolumeName is the volume's name in the event of operation o on pod
// volume p, as the kubelet names it: its volume spec's name, the
// PV's name for a PV (a migrated inline volume's translated PV too),
// else the pod's name of the volume; for an unpublish the unique volume
// name, as the kubelet's MountedVolume names it.
func EventVolumeName(o oe.Outcome, p podvol.PodVolume) string {
	switch {
	case o.Action.Kind == oe.OpUnpublish:
		return string(o.Spec.Name)
	case o.Spec.PVName != "":
		return o.Spec.PVName
	case p.SpecName != "":
		return p.SpecName
	}
	return string(o.Spec.Name)
}

// FailureEvent returns the reason and message of the warning event of
// failed operation o, for pod volume p (its pod's name of the volume; the
// zero value for an operation on the Node): "" when no event is recorded
// for it.
func FailureEvent(o oe.Outcome, p podvol.PodVolume) (reason, message string) {
	err := o.Err
	var opErr *oe.Error
	if errors.As(err, &opErr) {
		err = opErr.Err // what failed, without the operation's own words
	}
	var sub *SubPathError
	if errors.As(err, &sub) {
		err = sub.Err
	}
	step, cause := volume.EventCause(err)
	var inUse *volume.InUseError
	if o.Action.Kind == oe.OpUnstage && errors.As(err, &inUse) {
		cause = inUseCause(inUse, o.Spec.Mode)
	}
	reason, words := failedStep(o, step)
	if reason == "" {
		return "", ""
	}
	return reason, fmt.Sprintf("%s for volume %q : %s", words, EventVolumeName(o, p), cause)
}

// inUseCause is the kubelet's words for an unstage refused because mounts
// still reference the device.
func inUseCause(e *volume.InUseError, mode podvol.VolumeMode) string {
	if mode == podvol.Block {
		return fmt.Sprintf("the device %q is still referenced from other Pods %v", e.Path, e.Refs)
	}
	return fmt.Sprintf("the device mount path %q is still mounted by other references %v", e.Path, e.Refs)
}

// SubPathError is the error of an unpublish that could not clean the
// pod's subPath mounts of the volume first (cleanSubPaths).
type SubPathError struct{ Err error }

func (e *SubPathError) Error() string { return "cleaning its subPath mounts: " + e.Err.Error() }
func (e *SubPathError) Unwrap() error { return e.Err }

// refusalEvent returns the reason and message of the event of pod volume
// r.Pod, refused volume spec by the planner, in the kubelet's words:
//
//   - a ReadWriteOncePod volume another pod uses: the kubelet's check at
//     mount (IsVolumeMountedElsewhere), "MountVolume.SetUp failed"
//     ("MapVolume.SetUpDevice failed" for raw block);
//   - a lifecycle mode the driver does not list: the kubelet's CSI
//     mounter's check at SetUp;
//   - an SELinux context conflict: the kubelet's error when it adds the
//     pod's volume to its desired state. The kubelet has no event of its
//     own for it: the error ends its WaitForAttachAndMount, and its syncPod
//     records it after "Unable to attach or mount volumes: " and the
//     volumes it waited for, which is the embedder's event (the fork's,
//     from WaitError); nodevol's says the error alone.
func refusalEvent(spec *podvol.VolumeSpec, r planner.Refusal) (reason, message string) {
	name := r.Pod.SpecName
	if spec.PVName != "" {
		name = spec.PVName
	}
	var conflict *planner.SELinuxConflictError
	var lifecycle *planner.LifecycleModeError
	var cause string
	switch {
	case errors.As(r.Err, &conflict):
		return reasonFailedMount, fmt.Sprintf("conflicting SELinux labels of volume %s: %q and %q", name, conflict.OtherContext, conflict.Context)
	case errors.As(r.Err, &lifecycle):
		cause = fmt.Sprintf("kubernetes.io/csi: mounter.SetupAt failed to check volume lifecycle mode: volume mode %q not supported by driver %s (only supports %q)",
			lifecycle.Mode, lifecycle.Driver, lifecycle.Modes)
	case errors.Is(r.Err, planner.ErrReadWriteOncePod):
		cause = "volume uses the ReadWriteOncePod access mode and is already in use by another pod"
	default:
		_, cause = volume.EventCause(r.Err)
	}
	if spec.Mode == podvol.Block {
		return reasonFailedMap, fmt.Sprintf("MapVolume.SetUpDevice failed for volume %q : %s", name, cause)
	}
	return reasonFailedMount, fmt.Sprintf("MountVolume.SetUp failed for volume %q : %s", name, cause)
}

// ExpandError is the error of a node expansion that follows a publish, so
// that the pod's event says the expansion failed ("MountVolume.Setup
// failed while expanding volume", as the kubelet words it), not the
// publish.
type ExpandError struct{ Err error }

func (e *ExpandError) Error() string { return e.Err.Error() }
func (e *ExpandError) Unwrap() error { return e.Err }
