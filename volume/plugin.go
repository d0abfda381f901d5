package volume

import (
	"context"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/podvol"
)

// Plugin is a kind of volume: every plugin publishes its volumes into pods
// and takes them back (Mounter); what more it needs is in the optional
// interfaces of this package, and what it does with a volume is in its
// Capabilities.
type Plugin interface {
	// Name is the plugin's name, e.g. "kubernetes.io/csi": unique in a
	// Registry, and the first part of the unique name of each of its
	// volumes.
	Name() string
	// CanSupport reports whether the plugin handles the pod volume v.
	CanSupport(v *v1.Volume) bool
	// Capabilities says what the plugin does with the volume. An error
	// wrapping ErrNotReady means it cannot tell yet (a driver not
	// registered).
	Capabilities(spec *podvol.VolumeSpec) (Capabilities, error)
	Mounter
}

// Capabilities are what a plugin does with one volume: plain data the
// planner reads to decide which operations a volume needs.
type Capabilities struct {
	// Attachable: the volume is attached to the node before it is staged
	// (the plugin is an Attacher): the planner confirms the attachment.
	Attachable bool
	// Stages: the volume is staged once per node (MountDevice) before it
	// is published into pods, and unstaged after the last unpublish (the
	// plugin is a DeviceMounter).
	Stages bool
	// Block: the plugin can give pods the volume as a raw block device
	// (volumeDevices).
	Block bool
	// Republish: a published volume is published again at every resync
	// (CSI requiresRepublish: tokens and secrets that rotate), and, unless
	// RepublishAtResyncOnly, at once when what the pod reads through the
	// node changes (an API object it holds in the object cache, its pod
	// certificates): configMap, secret, downwardAPI and projected volumes
	// show those.
	Republish bool
	// RepublishAtResyncOnly: Republish is the driver's own refresh at each
	// resync (a CSI driver reads what it serves itself, not through the
	// node's object cache): a change of the pod's objects or certificates
	// does not publish the volume again, nor cut its backoff.
	RepublishAtResyncOnly bool
	// OwnershipChange: after publishing for a pod that has an fsGroup and
	// mounts the volume writable, the plugin gives that group ownership
	// of the volume's files (the kubelet's fsGroup walk); false when the
	// volume needs none or something else applies the group.
	OwnershipChange bool
	// LifecycleModes are the ways the volume's driver provides volumes
	// (CSI volumeLifecycleModes: Persistent for a PV, Ephemeral for a CSI
	// volume inline in the pod); the planner refuses the volume to its
	// pods when its own mode is not among them. Empty: any mode.
	LifecycleModes []storagev1.VolumeLifecycleMode
	// ReadOnly: the runtime mounts the volume read-only in every container,
	// whatever its volumeMounts say (the kubelet's configMap, secret,
	// downwardAPI and projected volumes); GetMountedVolumesForPod says so.
	ReadOnly bool
	// ProvidedByRuntime: the container runtime provides the volume itself
	// when it creates the containers (an image volume); the plugin's SetUp
	// sets nothing up and returns no path, and GetMountedVolumesForPod
	// says so.
	ProvidedByRuntime bool
	// SELinuxMount: the plugin mounts the volume with the SELinux context
	// of MountRequest.Volume.SELinuxLabel (mount option context="..."),
	// so that the runtime need not relabel its files: the kubelet's
	// SupportsSELinuxContextMount. The volume manager then gives a pod
	// volume of a PV, on a host with SELinux enabled, its containers'
	// label (an inline volume never gets one), and makes a pod that would
	// mount it with another context than the pods using it wait. The
	// CSI plugin reads it from the CSIDriver's seLinuxMount; none of the
	// kubelet's other plugins that nodevol has (emptyDir, hostPath,
	// local, nfs, image, configMap, secret, downwardAPI, projected) sets it in
	// Kubernetes 1.37, only its fc and iscsi plugins do.
	SELinuxMount bool
	// SizeLimit is the usage the volume's files may not exceed (an
	// emptyDir's sizeLimit, as the pod gives it); nil: none. Nothing
	// enforces it on disk (but the tmpfs of a memory emptyDir): the
	// volume manager measures the usage of a volume that has one
	// (StatsProvider) and reports it when UsedBytes exceed it, where the
	// kubelet's eviction manager evicts the pod.
	SizeLimit *resource.Quantity
}

// Mounter publishes and unpublishes a volume into a pod (NodePublishVolume).
type Mounter interface {
	// SetUp publishes the volume into the pod's volume directory and
	// returns the path it was published at ("" when the volume has no
	// path on the node). Idempotent.
	SetUp(ctx context.Context, req MountRequest) (string, error)
	// TearDown unpublishes the volume from the pod and removes the pod's
	// volume directory. Idempotent.
	TearDown(ctx context.Context, req MountRequest) error
}

// Attacher confirms that a volume is attached to this node.
type Attacher interface {
	// WaitForAttach returns the publish context once the volume is attached
	// to this node. It returns (nil, nil) at once when the driver needs no
	// attach. It does not block for long: "not attached yet" is an error
	// wrapping ErrNotReady, and the caller retries when something changes.
	WaitForAttach(ctx context.Context, spec *podvol.VolumeSpec) (map[string]string, error)
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
	Attach(ctx context.Context, spec *podvol.VolumeSpec) (map[string]string, error)
	// Detach deletes the volume's VolumeAttachment for this node and
	// returns nil once it is gone; while it is still there (the
	// external-attacher detaches first) the error wraps ErrNotReady, and
	// a detach error reported on it is returned. A VolumeAttachment of
	// another node is left alone.
	Detach(ctx context.Context, spec *podvol.VolumeSpec) error
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

// Expander grows a published volume on the node (NodeExpandVolume).
type Expander interface {
	// NodeExpand grows the volume to req.Size. expanded is false when
	// the plugin has nothing to do on the node for this volume.
	NodeExpand(ctx context.Context, req ExpandRequest) (expanded bool, err error)
}

// ObjectReader is a plugin whose pod volumes read API objects
// (configMaps, secrets, ClusterTrustBundles) and keep them current: the
// volume manager holds them in the node's one object cache for as long
// as a pod that has such a volume is known, as the kubelet registers a
// pod with its secret and configMap managers, and publishes the volumes
// again when one of them changes.
type ObjectReader interface {
	// Objects returns the objects the pod volume v of a pod in namespace
	// reads; none for a volume the plugin does not handle. It reads
	// nothing: the refs follow from v alone.
	Objects(namespace string, v *v1.Volume) []objectcache.Ref
}

// AttachmentNamer is an Attacher (or SelfAttacher) whose volumes are
// attached through a VolumeAttachment object (CSI): the volume manager
// watches the object an attach or a detach waits for, so that its change
// ends the wait at once, and in self-attach mode recognises at start the
// VolumeAttachments this node created.
type AttachmentNamer interface {
	// AttachmentName is the name of the VolumeAttachment that attaches
	// the volume to this node; "" when none does.
	AttachmentName(spec *podvol.VolumeSpec) string
}

// StatsProvider reports a published volume's usage (NodeGetVolumeStats).
type StatsProvider interface {
	// VolumeStats returns the usage of the volume published at
	// volumePath (staged at stagingPath, "" if not). ok is false when
	// the plugin cannot tell for this volume.
	VolumeStats(ctx context.Context, spec *podvol.VolumeSpec, volumePath, stagingPath string) (stats Stats, ok bool, err error)
}

// DeviceRequest asks for a volume to be staged or unstaged.
type DeviceRequest struct {
	Spec *podvol.VolumeSpec
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
	Pod podvol.PodVolume
}

// MountRequest asks for a volume to be published into, or unpublished from, a pod.
type MountRequest struct {
	Spec   *podvol.VolumeSpec
	Volume podvol.PodVolume
	// PublishContext is what WaitForAttach returned.
	PublishContext map[string]string
	// DeviceMountPath is what MountDevice returned ("" if not staged).
	DeviceMountPath string
	// ChangeOwnership, for a publish, is the planner's decision that the
	// plugin gives the pod's fsGroup ownership of the volume's files once
	// published (Capabilities.OwnershipChange, a writable use and an
	// fsGroup): the plugin obeys it and decides nothing of its own.
	ChangeOwnership bool
	// Republish, for a publish, says that the volume may already be
	// published for the pod and in use by it: it was Mounted (published
	// again, as a driver with requiresRepublish asks, or because what it
	// shows changed), or it was found on disk at start and has not been
	// published since. On a final error the plugin then leaves what an
	// earlier publish left (the pod's volume directory and its records):
	// removing it would leave the pod with stale contents that a later
	// publish could not repair, as the kubelet's IsRemount and
	// ReconstructedVolume keep them (kubernetes PR #139045).
	Republish bool
}

// ExpandRequest is a published volume to grow on the node.
type ExpandRequest struct {
	Spec *podvol.VolumeSpec
	// Pod is the pod whose publish of the volume the driver is given.
	Pod types.UID
	// VolumePath is where a filesystem volume is published for Pod and
	// StagingPath where it is staged ("" when the driver does not stage).
	// Both are ignored for a block volume: the plugin knows its paths.
	VolumePath, StagingPath string
	// Size is the new size in bytes: the PV's capacity.
	Size int64
}

// Stats is a published volume's usage, as NodeGetVolumeStats reports it.
// A count the plugin did not report is -1.
type Stats struct {
	CapacityBytes, AvailableBytes, UsedBytes int64
	Inodes, InodesFree, InodesUsed           int64
	// Condition is the volume's condition, when the plugin reported one;
	// nil otherwise.
	Condition *Condition
}

// Condition is a volume's health as its plugin reports it.
type Condition struct {
	// Abnormal: the volume is not healthy.
	Abnormal bool
	// Message says what is wrong (or that all is well).
	Message string
}
