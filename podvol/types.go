package podvol

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// UniqueVolumeName identifies a volume on the node. For CSI volumes it is
// "kubernetes.io/csi/{driver}^{volumeHandle}", the kubelet's own name, so that
// Node.Status.VolumesInUse means the same thing to both.
type UniqueVolumeName string

// CSIPluginName is the kubelet's name of the CSI volume plugin.
const CSIPluginName = "kubernetes.io/csi"

// PluginName is the name of the plugin of the volume spec describes:
// spec.Plugin, or the CSI plugin's when that is empty.
func (spec *VolumeSpec) PluginName() string {
	if spec.Plugin != "" {
		return spec.Plugin
	}
	return CSIPluginName
}

// CSIVolumeName returns the unique name of a CSI volume.
func CSIVolumeName(driver, volumeHandle string) UniqueVolumeName {
	return UniqueVolumeName(fmt.Sprintf("%s/%s^%s", CSIPluginName, driver, volumeHandle))
}

// MountState is the state of a staged device or of a pod's mount of a volume.
type MountState int

const (
	// NotMounted: nothing is mounted, as far as nodevol knows.
	NotMounted MountState = iota
	// Uncertain: an operation may have half-happened (a timed-out NodeStage,
	// a failed NodeUnpublish, a volume found on disk after a restart). The
	// volume must be mounted again or torn down before it is trusted.
	Uncertain
	// Mounted: the operation finished successfully.
	Mounted
)

func (s MountState) String() string {
	switch s {
	case NotMounted:
		return "NotMounted"
	case Uncertain:
		return "Uncertain"
	case Mounted:
		return "Mounted"
	}
	return fmt.Sprintf("MountState(%d)", int(s))
}

// MayBeMounted reports whether something may be mounted: Mounted or Uncertain.
func (s MountState) MayBeMounted() bool { return s != NotMounted }

// VolumeMode is the PV's volumeMode.
type VolumeMode string

const (
	// Filesystem volumes are published as a mounted directory.
	Filesystem VolumeMode = "Filesystem"
	// Block volumes are published as a raw block device.
	Block VolumeMode = "Block"
)

// SecretRef names a Secret.
type SecretRef struct {
	Namespace string
	Name      string
}

// VolumeSpec is everything the node needs to know about one CSI volume,
// resolved from the PV (or inline source) once by the populator. It is plain
// data: no API objects, no plugin objects.
type VolumeSpec struct {
	// Name is the unique volume name (see CSIVolumeName).
	Name UniqueVolumeName
	// PVName is the PersistentVolume's name; empty for inline volumes.
	PVName string
	// Claim is "namespace/name" of the claim the PV is bound to (its
	// claimRef), for messages; empty for inline volumes.
	Claim string
	// Driver is the CSI driver name.
	Driver string
	// VolumeHandle is the CSI volume ID.
	VolumeHandle string
	// Mode is Filesystem or Block.
	Mode VolumeMode
	// FSType is the PV's csi.fsType; may be empty.
	FSType string
	// ReadOnly is the PV's csi.readOnly (the pod's claim read-only flag is per pod).
	ReadOnly bool
	// AccessMode is the PV's first access mode ("ReadWriteOnce", ...), as the kubelet uses it.
	AccessMode string
	// AccessModes are all of the PV's access modes (the kubelet labels its
	// SELinux metrics with the widest of them); nil for an inline volume.
	AccessModes []v1.PersistentVolumeAccessMode
	// ReadWriteOnce says the PV lists ReadWriteOnce among its access modes,
	// wherever in the list: the kubelet's condition for applying fsGroup
	// under the ReadWriteOnceWithFSType policy (a PV with no access modes
	// gets none).
	ReadWriteOnce bool
	// MountOptions are the PV's spec.mountOptions.
	MountOptions []string
	// Attributes is, for a CSI volume, the PV's csi.volumeAttributes (the
	// CSI volume context); for a volume of another plugin, the parameters
	// its plugin resolved from the pod (volume.SpecResolver: an emptyDir's
	// tmpfs size), read by the same plugin only.
	Attributes map[string]string
	// NodeStageSecret and NodePublishSecret are the PV's secret references, if any.
	NodeStageSecret   *SecretRef
	NodePublishSecret *SecretRef
	// NodeExpandSecret is the PV's node-expand secret reference, if any.
	NodeExpandSecret *SecretRef
	// Ephemeral marks a pod-scoped volume, never attached or staged: an
	// inline CSI volume, or any volume of another plugin than CSI.
	Ephemeral bool
	// Plugin is the name of the volume's plugin when it is not the CSI
	// plugin (e.g. "kubernetes.io/image"); empty for CSI volumes, whose
	// Driver names their CSI driver. It starts Name, as every plugin's
	// does.
	Plugin string
	// Source is, for a pod volume of another plugin than CSI, the pod
	// volume's source as the pod spec gives it (what the plugin sets up);
	// nil for CSI volumes and PVs.
	Source *v1.VolumeSource
	// PVSource is, for a PV of another plugin than CSI (hostPath, local, nfs),
	// the PV's source; nil otherwise.
	PVSource *v1.PersistentVolumeSource
	// GID is the PV's pv.beta.kubernetes.io/gid annotation: a group the
	// pods using the volume get as a supplemental group. May be empty.
	GID string
	// MigratedFrom is the in-tree volume plugin (e.g. kubernetes.io/gce-pd)
	// whose PV or inline volume was translated to this CSI spec (CSI
	// migration); empty for a CSI volume.
	MigratedFrom string
}

// PodRef identifies a pod and carries what drivers may be told about it.
type PodRef struct {
	UID            types.UID
	Namespace      string
	Name           string
	ServiceAccount string
}

// String is "namespace/name", read after "pod" in messages. A pod found
// on disk at start and not added again is known only by its UID (a
// volume directory is named after it): "with UID {uid}", rather than "/".
func (p PodRef) String() string {
	if p.Namespace == "" && p.Name == "" {
		return "with UID " + string(p.UID)
	}
	return p.Namespace + "/" + p.Name
}

// PodVolume is one volume a pod wants mounted.
type PodVolume struct {
	Pod PodRef
	// SpecName is the name of the volume in pod.spec.volumes; it names the
	// pod's volume directory of an inline volume.
	SpecName string
	// PVName is the PV through which the pod has the volume, "" for an
	// inline volume; it names the pod's volume directory, as the kubelet
	// names it. Several PVs may name one volume (the same driver and
	// handle): each pod's directory is named after its own.
	PVName string
	// ReadOnly is true when the pod's claim or the PV asks for read-only.
	ReadOnly bool
	// FSGroup is the pod's securityContext.fsGroup: the group that gets
	// ownership of the volume's files.
	FSGroup *int64
	// FSGroupOnRootMismatch is the pod's fsGroupChangePolicy OnRootMismatch:
	// ownership is changed only when the volume's root does not already
	// have it.
	FSGroupOnRootMismatch bool
	// SELinuxLabel is the SELinux context the pod mounts the volume with
	// (mount option context="..."), "" for none: the file label of its
	// containers' seLinuxOptions, where the kubelet would mount with it
	// (volumemanager/selinux.go).
	SELinuxLabel string
}

// MountedVolume is one volume of a pod, as GetMountedVolumesForPod reports it.
type MountedVolume struct {
	// Name is the unique volume name (see CSIVolumeName).
	Name UniqueVolumeName
	// SpecName is the volume's name in pod.spec.volumes.
	SpecName string
	// DirName names the volume's directories under the pod
	// (volumes/{plugin}/{DirName}, volume-subpaths/{DirName}): the PV's
	// name for a claim, else SpecName, as the kubelet names them (its
	// inner volume spec name).
	DirName string
	// Plugin is the name of the volume's plugin ("kubernetes.io/csi",
	// "kubernetes.io/empty-dir", ...).
	Plugin string
	// Driver is the CSI driver name; empty for other plugins.
	Driver string
	// State is Mounted, or Uncertain when a publish may have half-happened
	// (GetMountedVolumesForPod returns only the Mounted ones).
	State MountState
	// Path is where the volume is for the pod's containers, as the kubelet
	// gives it to the runtime: for a CSI volume
	// {root}/pods/{uid}/volumes/kubernetes.io~csi/{pv}/mount, or for a
	// block volume the symlink
	// {root}/pods/{uid}/volumeDevices/kubernetes.io~csi/{pv} ({pv} the
	// PV's name, or the pod's volume name for an inline volume); for an
	// emptyDir {root}/pods/{uid}/volumes/kubernetes.io~empty-dir/{name};
	// for a hostPath the host path itself. Empty when ProvidedByRuntime.
	Path string
	// Block is true when the volume is a raw block device (Path is then
	// the device's symlink or the device).
	Block bool
	// ProvidedByRuntime is true when the container runtime provides the
	// volume itself (an image volume): nodevol has nothing on the node
	// for it, and the runtime mounts it when it creates the containers.
	ProvidedByRuntime bool
	// ReadOnly is true when the pod's claim or the PV is read-only, or
	// when the runtime mounts the volume read-only in every container
	// (configMap, secret, downwardAPI and projected volumes, as the
	// kubelet mounts them).
	ReadOnly bool
	// SELinuxContext is the SELinux context the volume was mounted with
	// for the pod (mount option context="..."), "" when it was mounted
	// with none. A volume mounted with a context already carries the
	// pod's label on every file: the runtime must not relabel it (a
	// kubelet fork reports it as its SELinuxLabeled, and its mounter's
	// SELinuxRelabel as false, as the kubelet's plugins that mount with a
	// context do).
	SELinuxContext string
}
