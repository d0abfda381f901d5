package csiplugin

import (
	"context"
	"fmt"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/nodevol/nodevol/cache"
	"github.com/nodevol/nodevol/csi"
)

// VolumeStats is a published volume's usage, as NodeGetVolumeStats
// reports it. A count the driver did not report is -1.
type VolumeStats struct {
	CapacityBytes, AvailableBytes, UsedBytes int64
	Inodes, InodesFree, InodesUsed           int64
	// Condition is the volume's condition, for a driver with the
	// VOLUME_CONDITION capability that reported one; nil otherwise.
	Condition *csi.VolumeCondition
}

// VolumeStats asks the driver for the usage of a volume published at
// volumePath (staged at stagingPath, "" if not). ok is false when the
// driver does not implement NodeGetVolumeStats.
func (p *Plugin) VolumeStats(ctx context.Context, spec *cache.VolumeSpec, volumePath, stagingPath string) (stats VolumeStats, ok bool, err error) {
	client, err := p.drivers.Client(spec.Driver)
	if err != nil {
		return VolumeStats{}, false, fmt.Errorf("volume stats of %s: %w", volumeDesc(spec), err)
	}
	if !client.Capabilities().GetVolumeStats {
		return VolumeStats{}, false, nil
	}
	resp, err := client.Bound(p.timeout, p.steps).NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{
		VolumeId:          spec.VolumeHandle,
		VolumePath:        volumePath,
		StagingTargetPath: stagingPath,
	})
	if err != nil {
		return VolumeStats{}, false, fmt.Errorf("volume stats of %s at %s: %w", volumeDesc(spec), volumePath, err)
	}
	s := statsFrom(resp)
	if client.Capabilities().VolumeCondition {
		s.Condition = csi.VolumeConditionOf(resp)
	}
	return s, true, nil
}

func statsFrom(resp *csipb.NodeGetVolumeStatsResponse) VolumeStats {
	s := VolumeStats{CapacityBytes: -1, AvailableBytes: -1, UsedBytes: -1, Inodes: -1, InodesFree: -1, InodesUsed: -1}
	for _, u := range resp.GetUsage() {
		switch u.GetUnit() {
		case csipb.VolumeUsage_BYTES:
			s.CapacityBytes, s.AvailableBytes, s.UsedBytes = u.GetTotal(), u.GetAvailable(), u.GetUsed()
		case csipb.VolumeUsage_INODES:
			s.Inodes, s.InodesFree, s.InodesUsed = u.GetTotal(), u.GetAvailable(), u.GetUsed()
		}
	}
	return s
}
