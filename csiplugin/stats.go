package csiplugin

import (
	"context"
	"fmt"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// VolumeStats asks the driver for the usage of a volume published at
// volumePath (staged at stagingPath, "" if not). ok is false when the
// driver does not implement NodeGetVolumeStats.
func (p *plugin) VolumeStats(ctx context.Context, spec *podvol.VolumeSpec, volumePath, stagingPath string) (stats volume.Stats, ok bool, err error) {
	client, err := p.drivers.Client(spec.Driver)
	if err != nil {
		return volume.Stats{}, false, fmt.Errorf("volume stats of %s: %w", volumeDesc(spec), err)
	}
	if !client.Capabilities().GetVolumeStats {
		return volume.Stats{}, false, nil
	}
	resp, cond, err := client.Bound(p.timeout, p.steps).NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{
		VolumeId:          spec.VolumeHandle,
		VolumePath:        volumePath,
		StagingTargetPath: stagingPath,
	})
	if err != nil {
		return volume.Stats{}, false, fmt.Errorf("volume stats of %s at %s: %w", volumeDesc(spec), volumePath, err)
	}
	s := statsFrom(resp)
	s.Condition = cond
	return s, true, nil
}

func statsFrom(resp *csipb.NodeGetVolumeStatsResponse) volume.Stats {
	s := volume.Stats{CapacityBytes: -1, AvailableBytes: -1, UsedBytes: -1, Inodes: -1, InodesFree: -1, InodesUsed: -1}
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
