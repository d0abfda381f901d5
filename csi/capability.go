package csi

import (
	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	v1 "k8s.io/api/core/v1"
)

// Capabilities are a driver's node service capabilities, fetched once when
// the driver registers.
type Capabilities struct {
	// StageUnstage: the driver implements NodeStageVolume / NodeUnstageVolume.
	StageUnstage bool
	// GetVolumeStats: the driver implements NodeGetVolumeStats.
	GetVolumeStats bool
	// Expand: the driver implements NodeExpandVolume.
	Expand bool
	// SingleNodeMultiWriter: the driver knows the SINGLE_NODE_SINGLE_WRITER
	// and SINGLE_NODE_MULTI_WRITER access modes.
	SingleNodeMultiWriter bool
	// VolumeMountGroup: the driver applies an fsGroup itself
	// (volume_mount_group).
	VolumeMountGroup bool
	// VolumeHealth: the driver implements NodeGetVolumeHealth (CSI 1.13;
	// earlier versions reported a volume condition in NodeGetVolumeStats).
	VolumeHealth bool
	// StorageHealth: the driver implements NodeGetStorageHealth (CSI 1.13).
	StorageHealth bool
	// VolumeCondition: the driver reports a volume condition in
	// NodeGetVolumeStats (VOLUME_CONDITION of CSI 1.3 to 1.12; see
	// condition.go).
	VolumeCondition bool
}

func capabilitiesFrom(resp *csipb.NodeGetCapabilitiesResponse) Capabilities {
	var c Capabilities
	for _, capability := range resp.GetCapabilities() {
		switch capability.GetRpc().GetType() {
		case csipb.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME:
			c.StageUnstage = true
		case csipb.NodeServiceCapability_RPC_GET_VOLUME_STATS:
			c.GetVolumeStats = true
		case csipb.NodeServiceCapability_RPC_EXPAND_VOLUME:
			c.Expand = true
		case csipb.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER:
			c.SingleNodeMultiWriter = true
		case csipb.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP:
			c.VolumeMountGroup = true
		case csipb.NodeServiceCapability_RPC_GET_VOLUME_HEALTH:
			c.VolumeHealth = true
		case csipb.NodeServiceCapability_RPC_GET_STORAGE_HEALTH:
			c.StorageHealth = true
		case volumeConditionCapability:
			c.VolumeCondition = true
		}
	}
	return c
}

// AccessMode maps a PV access mode to the CSI one a driver with
// capabilities c gets, as the kubelet does. With SingleNodeMultiWriter ReadWriteOnce becomes
// SINGLE_NODE_MULTI_WRITER (any number of pods on this node may write) and
// ReadWriteOncePod SINGLE_NODE_SINGLE_WRITER; without it both are
// SINGLE_NODE_WRITER. An empty mode is ReadWriteOnce, as the kubelet sends
// it for inline volumes and PVs without access modes; an unknown mode gives
// UNKNOWN.
func (c Capabilities) AccessMode(mode string) csipb.VolumeCapability_AccessMode_Mode {
	switch v1.PersistentVolumeAccessMode(mode) {
	case v1.ReadWriteOnce, "":
		if c.SingleNodeMultiWriter {
			return csipb.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER
		}
		return csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	case v1.ReadOnlyMany:
		return csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
	case v1.ReadWriteMany:
		return csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
	case v1.ReadWriteOncePod:
		if c.SingleNodeMultiWriter {
			return csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
		}
		return csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	}
	return csipb.VolumeCapability_AccessMode_UNKNOWN
}
