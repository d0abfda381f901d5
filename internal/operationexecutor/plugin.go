package operationexecutor

import (
	"context"
	"errors"
	"fmt"

	"github.com/nodevol/nodevol/cache"
)

// The interfaces below are what the operations need from a volume plugin.
// csiplugin implements them; tests use fakes.

// Attacher confirms that a volume is attached to this node.
type Attacher interface {
	// WaitForAttach returns the publish context once the volume is attached
	// to this node. It returns (nil, nil) at once when the driver needs no
	// attach. It does not block for long: "not attached yet" is an error
	// wrapping ErrNotReady, and the caller retries when something changes.
	WaitForAttach(ctx context.Context, spec *cache.VolumeSpec) (map[string]string, error)
}

// DeviceMounter stages and unstages a volume's device (NodeStageVolume).
type DeviceMounter interface {
	// MountDevice stages the volume and returns the device mount path
	// (the staging path), or "" when the driver does not stage volumes.
	// Idempotent.
	MountDevice(ctx context.Context, req DeviceRequest) (string, error)
	// UnmountDevice unstages the volume and removes the staging directory.
	// Idempotent: a volume that is not staged is not an error.
	UnmountDevice(ctx context.Context, req DeviceRequest) error
}

// Mounter publishes and unpublishes a volume into a pod (NodePublishVolume).
type Mounter interface {
	// SetUp publishes the volume into the pod's volume directory and
	// returns the path it was published at. Idempotent.
	SetUp(ctx context.Context, req MountRequest) (string, error)
	// TearDown unpublishes the volume from the pod and removes the pod's
	// volume directory. Idempotent.
	TearDown(ctx context.Context, req MountRequest) error
}

// SelfAttacher attaches and detaches volumes from the node itself (the
// kubelet's --enable-controller-attach-detach=false): it writes the
// VolumeAttachment that the attach/detach controller writes otherwise.
type SelfAttacher interface {
	// Attach creates the volume's VolumeAttachment for this node if it
	// is missing and returns the publish context once it is attached,
	// as WaitForAttach does ((nil, nil) when the volume needs no
	// attachment). Not attached yet is an error wrapping ErrNotReady. A
	// VolumeAttachment of the same name that belongs to another node is
	// a final error: it is not adopted.
	Attach(ctx context.Context, spec *cache.VolumeSpec) (map[string]string, error)
	// Detach deletes the volume's VolumeAttachment for this node and
	// returns nil once it is gone; while it is still there (the
	// external-attacher detaches first) the error wraps ErrNotReady, and
	// a detach error reported on it is returned. A VolumeAttachment of
	// another node is left alone.
	Detach(ctx context.Context, spec *cache.VolumeSpec) error
}

// Plugin is a whole volume plugin.
type Plugin interface {
	Attacher
	DeviceMounter
	Mounter
}

// DeviceRequest asks for a volume to be staged or unstaged.
type DeviceRequest struct {
	Spec *cache.VolumeSpec
	// PublishContext is what WaitForAttach returned.
	PublishContext map[string]string
	// DeviceMountPath is, for an unstage, where the device is staged as
	// far as the caller knows ("" when unknown).
	DeviceMountPath string
	// SELinuxContext, for a stage, is the SELinux context to mount the
	// device with (mount option context="..."); "" for none.
	SELinuxContext string
	// Pod is, for a stage, the pod whose mount needs the volume staged:
	// a driver that applies fsGroup itself (VOLUME_MOUNT_GROUP) gets its
	// fsGroup, as the kubelet passes the fsGroup of the pod being
	// mounted. Empty for an unstage.
	Pod cache.PodVolume
}

// MountRequest asks for a volume to be published into, or unpublished from, a pod.
type MountRequest struct {
	Spec   *cache.VolumeSpec
	Volume cache.PodVolume
	// PublishContext is what WaitForAttach returned.
	PublishContext map[string]string
	// DeviceMountPath is what MountDevice returned ("" if not staged).
	DeviceMountPath string
}

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

// selfAttach runs OpSelfAttach or OpSelfDetach on a plugin that can.
func selfAttach(ctx context.Context, p Plugin, kind OpKind, spec *cache.VolumeSpec) (map[string]string, error) {
	sa, ok := p.(SelfAttacher)
	if !ok {
		return nil, fmt.Errorf("the volume plugin cannot attach volumes itself (%T does not implement SelfAttacher)", p)
	}
	if kind == OpSelfAttach {
		return sa.Attach(ctx, spec)
	}
	return nil, sa.Detach(ctx, spec)
}
