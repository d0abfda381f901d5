package csiplugin

import (
	"fmt"
	"slices"
	"strconv"

	storagev1 "k8s.io/api/storage/v1"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/nodevol/nodevol/cache"
	"github.com/nodevol/nodevol/csi"
)

// withSELinuxContext adds the mount option context="<label>" to a mount
// capability, as the kubelet's AddSELinuxMountOption does for
// NodeStageVolume and NodePublishVolume: after the PV's mount options,
// quoted, since an MCS level holds commas (s0:c1,c2). The caller decides
// whether the volume gets one (volumemanager: the CSIDriver's
// seLinuxMount, the host, the access mode, the pod); "" adds nothing, and
// a block capability is left alone.
func withSELinuxContext(vc *csipb.VolumeCapability, label string) *csipb.VolumeCapability {
	m := vc.GetMount()
	if label == "" || m == nil {
		return vc
	}
	// A copy: the flags are the spec's mount options, shared.
	m.MountFlags = append(slices.Clone(m.MountFlags), fmt.Sprintf("context=%q", label))
	return vc
}

// mountGroup is the fsGroup a driver gets as volume_mount_group in
// NodeStageVolume and NodePublishVolume: the pod's, when the driver applies
// it itself (VOLUME_MOUNT_GROUP) and its CSIDriver's fsGroupPolicy is not
// None (File, or the default ReadWriteOnceWithFSType); else nil. The fsType
// and access mode rules of ReadWriteOnceWithFSType decide only whether
// nodevol changes ownership itself (needsOwnership): delegation does not
// look at the volume, as in the kubelet. (The kubelet delegates under None
// too; nodevol reads None as "leave the volume's ownership alone".)
func mountGroup(caps csi.Capabilities, driver *storagev1.CSIDriver, fsGroup *int64) *int64 {
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
func volumeCapability(spec *cache.VolumeSpec, caps csi.Capabilities, fsGroup *int64) *csipb.VolumeCapability {
	vc := &csipb.VolumeCapability{
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: caps.AccessMode(spec.AccessMode)},
	}
	if spec.Mode == cache.Block {
		vc.AccessType = &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}}
		return vc
	}
	m := &csipb.VolumeCapability_MountVolume{FsType: spec.FSType, MountFlags: spec.MountOptions}
	if fsGroup != nil {
		m.VolumeMountGroup = strconv.FormatInt(*fsGroup, 10)
	}
	vc.AccessType = &csipb.VolumeCapability_Mount{Mount: m}
	return vc
}
