package operationexecutor

import (
	"context"
	"fmt"
	"time"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// OpKind is one kind of volume operation.
type OpKind int

const (
	// OpAttach confirms the volume is attached (WaitForAttach).
	OpAttach OpKind = iota
	// OpStage stages the device (MountDevice, NodeStageVolume).
	OpStage
	// OpPublish publishes into a pod (SetUp, NodePublishVolume).
	OpPublish
	// OpUnpublish unpublishes from a pod (TearDown, NodeUnpublishVolume).
	OpUnpublish
	// OpUnstage unstages the device (UnmountDevice, NodeUnstageVolume).
	OpUnstage
	// OpExpand grows a published volume on the node (NodeExpandVolume).
	// Do does not run it: the caller owns expansion.
	OpExpand
	// OpSelfAttach attaches the volume in self-attach mode: the node
	// creates the VolumeAttachment itself, as the kubelet does with
	// --enable-controller-attach-detach=false, and confirms it attached
	// (SelfAttacher.Attach).
	OpSelfAttach
	// OpSelfDetach deletes the VolumeAttachment the node created, once
	// the volume is unstaged, and confirms it gone (SelfAttacher.Detach).
	OpSelfDetach
)

// String returns the kubelet's operation name, used in metrics and backoff.
func (k OpKind) String() string {
	switch k {
	case OpAttach:
		return "verify_controller_attached_volume"
	case OpStage:
		return "mount_device"
	case OpPublish:
		return "volume_mount"
	case OpUnpublish:
		return "volume_unmount"
	case OpUnstage:
		return "unmount_device"
	case OpExpand:
		return "volume_fs_resize"
	case OpSelfAttach:
		return "volume_attach"
	case OpSelfDetach:
		return "volume_detach"
	}
	return fmt.Sprintf("OpKind(%d)", int(k))
}

// NameFor is the operation's name for a volume of mode: the kubelet's
// block names (map_volume, unmap_volume, unmap_device) for raw block
// volumes, whose staging nodevol runs as map_device.
func (k OpKind) NameFor(mode podvol.VolumeMode) string {
	if mode == podvol.Block {
		switch k {
		case OpStage:
			return "map_device"
		case OpPublish:
			return "map_volume"
		case OpUnpublish:
			return "unmap_volume"
		case OpUnstage:
			return "unmap_device"
		}
	}
	return k.String()
}

// Method is the method of the plugin contract the operation calls.
func (k OpKind) Method() volume.Method {
	switch k {
	case OpAttach:
		return volume.MethodWaitForAttach
	case OpSelfAttach:
		return volume.MethodAttach
	case OpSelfDetach:
		return volume.MethodDetach
	case OpStage:
		return volume.MethodMountDevice
	case OpUnstage:
		return volume.MethodUnmountDevice
	case OpPublish:
		return volume.MethodSetUp
	case OpUnpublish:
		return volume.MethodTearDown
	case OpExpand:
		return volume.MethodNodeExpand
	}
	return volume.Method(k.String())
}

// steps are the kubelet's words for each operation's step, on a file
// system volume and on a raw block one. (The kubelet waits for the
// attachment inside its mount and map operations.)
var steps = map[OpKind][2]string{
	OpAttach:     {"MountVolume.WaitForAttach", "MapVolume.WaitForAttach"},
	OpSelfAttach: {"AttachVolume.Attach", "AttachVolume.Attach"},
	OpStage:      {"MountVolume.MountDevice", "MapVolume.SetUpDevice"},
	OpPublish:    {"MountVolume.SetUp", "MapVolume.MapPodDevice"},
	OpExpand:     {"NodeExpandVolume.NodeExpandVolume", "NodeExpandVolume.NodeExpandVolume"},
	OpUnpublish:  {"UnmountVolume.TearDown", "UnmapVolume.UnmapPodDevice"},
	OpUnstage:    {"UnmountDevice", "UnmapDevice.TearDownDevice"},
	OpSelfDetach: {"DetachVolume.Detach", "DetachVolume.Detach"},
}

// Step is the kubelet's name of the operation's step for a volume of mode,
// the words of its events and logs ("MountVolume.SetUp";
// "MapVolume.MapPodDevice" for raw block): what a wait error says runs
// when the plugin names no call of its own (volume.CallNamer).
func (k OpKind) Step(mode podvol.VolumeMode) string {
	words, ok := steps[k]
	if !ok {
		return k.NameFor(mode)
	}
	if mode == podvol.Block {
		return words[1]
	}
	return words[0]
}

// Action is one operation the reconciler wants done.
type Action struct {
	Kind   OpKind
	Volume podvol.UniqueVolumeName
	// Pod is set for OpPublish and OpUnpublish, for OpStage (the pod being
	// mounted, whose fsGroup a driver may apply at stage) and for OpExpand
	// (the pod whose published path the driver is given).
	Pod podvol.PodVolume
	// SELinuxContext is, for OpStage, the SELinux context the device is
	// staged with ("" for none). A publish has its pod's, Pod.SELinuxLabel.
	SELinuxContext string
	// Expand, if > 0 on an OpPublish, is the size in bytes the volume is
	// grown to (NodeExpandVolume) right after it is published and before
	// the pod's mount counts as done: the kubelet's expansion while
	// mounting. Do does not run it: the caller owns expansion.
	Expand int64
	// ChangeOwnership, on an OpPublish, makes the plugin give the pod's
	// fsGroup ownership of the published volume (the planner's decision,
	// volume.MountRequest.ChangeOwnership).
	ChangeOwnership bool
	// Republish, on an OpPublish, says that the pod may be using the
	// volume already (volume.MountRequest.Republish): it was Mounted, or
	// found on disk at start and not published since.
	Republish bool
	// CleanSubPaths, on an OpUnpublish, makes the caller clean the pod's
	// subPath bind mounts of the volume before the unpublish (the
	// planner's decision). Do does not run it: the caller owns the pods'
	// subPath mounts.
	CleanSubPaths bool
}

// Key returns the exclusion key of the action.
func (a Action) Key() Key {
	if a.Kind == OpPublish || a.Kind == OpUnpublish {
		return Key{Volume: a.Volume, Pod: a.Pod.Pod.UID}
	}
	return Key{Volume: a.Volume}
}

func (a Action) String() string {
	if a.Kind == OpPublish || a.Kind == OpUnpublish {
		if a.Expand > 0 {
			return fmt.Sprintf("%s %s pod=%s expand=%d", a.Kind, a.Volume, a.Pod.Pod, a.Expand)
		}
		return fmt.Sprintf("%s %s pod=%s", a.Kind, a.Volume, a.Pod.Pod)
	}
	return fmt.Sprintf("%s %s", a.Kind, a.Volume)
}

// Outcome is what an operation did. The reconcile loop applies it to the actual state.
type Outcome struct {
	Action Action
	Spec   podvol.VolumeSpec
	// Err is nil on success.
	Err error
	// Uncertain is true when Err means the operation may have half-happened.
	Uncertain bool
	// NotRun is true when the operation never started (its context ended
	// while it waited for a slot): nothing happened.
	NotRun bool
	// Path is the staging path (OpStage) or the pod's volume path (OpPublish).
	Path string
	// PublishContext is set by OpAttach and OpSelfAttach: nil when the
	// volume needs no attachment, never nil when a VolumeAttachment says
	// it is attached.
	PublishContext map[string]string
	// Duration is how long the plugin call took.
	Duration time.Duration
	// Expansion is what a node expansion (OpExpand, or an OpPublish with
	// Expand) that returned no error did.
	Expansion ExpandResult
}

// ExpandResult is what a node expansion that returned no error did: it
// grew the volume (Size), or it left it as it was and is not to be asked
// again for the same size (Held).
type ExpandResult struct {
	// Size is the size in bytes the node has grown the volume to; 0 when
	// the volume kept its size.
	Size int64
	// Held, when > 0, is the size the node is not to be asked to grow the
	// volume to again: while the claim the expansion was planned with is
	// still at resourceVersion HeldClaim (the claim has moved on meanwhile,
	// or the driver refused; the claim's next version says what is due),
	// or, with HeldClaim "", until the volume is set up again (the driver
	// cannot grow it in use).
	Held      int64
	HeldClaim string
}

// Input is what an operation needs from the actual state.
type Input struct {
	Spec            podvol.VolumeSpec
	PublishContext  map[string]string
	DeviceMountPath string
}

// Do runs one plugin operation (not OpExpand) with the plugin that
// plugins finds for the volume and returns its outcome: the error, if any,
// names the operation, volume, driver and pod, and says whether the
// operation may have half-happened.
func Do(ctx context.Context, plugins *volume.Registry, a Action, in Input) Outcome {
	spec := in.Spec
	out := Outcome{Action: a, Spec: spec}
	start := time.Now()
	p, err := plugins.ForVolume(spec.Name)
	if err == nil {
		out.PublishContext, out.Path, err = run(ctx, p, a, in, &spec)
	}
	out.Duration = time.Since(start)
	if err != nil {
		out.Uncertain = volume.IsUncertain(err)
		out.Err = OpError(a, spec, err)
	}
	return out
}

// run makes the plugin call of a: the publish context of an attach, the
// path of a stage or publish. An operation the plugin has no interface
// for is an error: the planner asks for it only when the plugin's
// capabilities say it has one.
func run(ctx context.Context, p volume.Plugin, a Action, in Input, spec *podvol.VolumeSpec) (publishContext map[string]string, path string, err error) {
	switch a.Kind {
	case OpAttach:
		if at, ok := p.(volume.Attacher); ok {
			publishContext, err = at.WaitForAttach(ctx, spec)
			return publishContext, "", err
		}
	case OpSelfAttach, OpSelfDetach:
		if sa, ok := p.(volume.SelfAttacher); ok {
			if a.Kind == OpSelfAttach {
				publishContext, err = sa.Attach(ctx, spec)
				return publishContext, "", err
			}
			return nil, "", sa.Detach(ctx, spec)
		}
	case OpStage, OpUnstage:
		if dm, ok := p.(volume.DeviceMounter); ok {
			req := volume.DeviceRequest{Spec: spec, PublishContext: in.PublishContext}
			if a.Kind == OpStage {
				req.SELinuxContext, req.Pod = a.SELinuxContext, a.Pod
				path, err = dm.MountDevice(ctx, req)
				return nil, path, err
			}
			req.DeviceMountPath = in.DeviceMountPath
			return nil, "", dm.UnmountDevice(ctx, req)
		}
	case OpPublish:
		path, err = p.SetUp(ctx, volume.MountRequest{Spec: spec, Volume: a.Pod, PublishContext: in.PublishContext, DeviceMountPath: in.DeviceMountPath,
			ChangeOwnership: a.ChangeOwnership, Republish: a.Republish})
		return nil, path, err
	case OpUnpublish:
		return nil, "", p.TearDown(ctx, volume.MountRequest{Spec: spec, Volume: a.Pod, PublishContext: in.PublishContext, DeviceMountPath: in.DeviceMountPath})
	default:
		return nil, "", fmt.Errorf("operation %v is not a plugin operation", a.Kind)
	}
	return nil, "", fmt.Errorf("volume plugin %s cannot run %s (%T does not implement the interface)", p.Name(), a.Kind, p)
}

// OpError wraps err with what failed: the operation, volume, driver and,
// for operations on one pod's use and expansions, the pod. The result is
// an *Error.
func OpError(a Action, spec podvol.VolumeSpec, err error) error {
	return &Error{Op: a.Kind.NameFor(spec.Mode), Volume: spec.Name, Driver: spec.Driver, Pod: podOf(a), Err: err}
}

// Error is the error of an operation (OpError): it names the operation,
// the volume, the driver and, for an operation on one pod's use, the pod,
// for logs and wait errors; Err is what failed, from which the volume
// manager's events take the kubelet's words (volume.EventCause).
type Error struct {
	// Op is the operation's name (OpKind.NameFor), Volume the volume's
	// unique name, Driver its CSI driver ("" for another plugin).
	Op     string
	Volume podvol.UniqueVolumeName
	Driver string
	// Pod is "namespace/name" for OpPublish, OpUnpublish and OpExpand,
	// else "".
	Pod string
	// Err is the failure: the plugin's error, or the volume manager's.
	Err error
}

func (e *Error) Error() string {
	pod := ""
	if e.Pod != "" {
		pod = ", pod " + e.Pod
	}
	return fmt.Sprintf("%s failed for volume %q (driver %s%s): %v", e.Op, e.Volume, e.Driver, pod, e.Err)
}

// Unwrap returns Err.
func (e *Error) Unwrap() error { return e.Err }

// podOf is the pod an operation is for, "namespace/name", for operations
// on one pod's use and for an expansion (the pod whose published path the
// driver is given).
func podOf(a Action) string {
	if a.Kind == OpPublish || a.Kind == OpUnpublish || a.Kind == OpExpand {
		return a.Pod.Pod.String()
	}
	return ""
}
