package csiplugin

import (
	"fmt"
	"slices"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// withSELinuxContext adds the mount option context="<label>" to a mount
// capability, as the kubelet's AddSELinuxMountOption does for
// NodeStageVolume and NodePublishVolume: after the PV's mount options,
// quoted, since an MCS level holds commas (s0:c1,c2). The caller decides
// whether the volume gets one (volumemanager: the CSIDriver's
// seLinuxMount, the host, the access mode, the pod); "" adds nothing, and
// a block capability is left alone.
func withSELinuxContext(vc *csi.VolumeCapability, label string) *csi.VolumeCapability {
	m := vc.GetMount()
	if label == "" || m == nil {
		return vc
	}
	// A copy: the flags are the spec's mount options, shared.
	m.MountFlags = append(slices.Clone(m.MountFlags), fmt.Sprintf("context=%q", label))
	return vc
}
