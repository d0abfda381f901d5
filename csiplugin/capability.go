package csiplugin

import (
	"strconv"

	"github.com/container-storage-interface/spec/lib/go/csi"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/nodevol/nodevol/cache"
)

// accessMode maps a PV access mode to a CSI one, as the kubelet does. With
// the SingleNodeMultiWriter capability ReadWriteOnce becomes
// SINGLE_NODE_MULTI_WRITER (any number of pods on this node may write) and
// ReadWriteOncePod SINGLE_NODE_SINGLE_WRITER; without it both are
// SINGLE_NODE_WRITER. An empty mode is ReadWriteOnce, as the kubelet sends
// it for inline volumes and PVs without access modes; an unknown mode gives
// UNKNOWN.
func accessMode(mode string, caps Capabilities) csi.VolumeCapability_AccessMode_Mode {
	switch v1.PersistentVolumeAccessMode(mode) {
	case v1.ReadWriteOnce, "":
		if caps.SingleNodeMultiWriter {
			return csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER
		}
		return csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	case v1.ReadOnlyMany:
		return csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
	case v1.ReadWriteMany:
		return csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
	case v1.ReadWriteOncePod:
		if caps.SingleNodeMultiWriter {
			return csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
		}
		return csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	}
	return csi.VolumeCapability_AccessMode_UNKNOWN
}

// mountGroup is the fsGroup a driver gets as volume_mount_group in
// NodeStageVolume and NodePublishVolume: the pod's, when the driver applies
// it itself (VOLUME_MOUNT_GROUP) and its CSIDriver's fsGroupPolicy is not
// None (File, or the default ReadWriteOnceWithFSType); else nil. The fsType
// and access mode rules of ReadWriteOnceWithFSType decide only whether
// nodevol changes ownership itself (needsOwnership): delegation does not
// look at the volume, as in the kubelet. (The kubelet delegates under None
// too; nodevol reads None as "leave the volume's ownership alone".)
func mountGroup(caps Capabilities, driver *storagev1.CSIDriver, fsGroup *int64) *int64 {
	if !caps.VolumeMountGroup || fsGroup == nil {
		return nil
	}
	if driver != nil && driver.Spec.FSGroupPolicy != nil && *driver.Spec.FSGroupPolicy == storagev1.NoneFSGroupPolicy {
		return nil
	}
	return fsGroup
}

// volumeCapability builds the capability a volume is staged and published
// with: a block volume for Block mode, else a mount volume with the PV's
// fsType and mountOptions, and the pod's fsGroup as volume_mount_group when
// fsGroup is given (the caller checks the driver may apply it).
func volumeCapability(spec *cache.VolumeSpec, caps Capabilities, fsGroup *int64) *csi.VolumeCapability {
	vc := &csi.VolumeCapability{
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: accessMode(spec.AccessMode, caps)},
	}
	if spec.Mode == cache.Block {
		vc.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
		return vc
	}
	m := &csi.VolumeCapability_MountVolume{FsType: spec.FSType, MountFlags: spec.MountOptions}
	if fsGroup != nil {
		m.VolumeMountGroup = strconv.FormatInt(*fsGroup, 10)
	}
	vc.AccessType = &csi.VolumeCapability_Mount{Mount: m}
	return vc
}
