package emptydir

import (
	"context"
	"fmt"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/internal/du"
)

// VolumeStats implements volume.StatsProvider as the kubelet measures an
// emptyDir, whatever its medium (its du metrics provider, asked afresh at
// each call): UsedBytes and InodesUsed from a walk of the volume (st_blocks
// of each file and directory, hard links counted once, the volume's root
// included, nothing on another device), the rest from statfs of the file
// system the volume is on (its own tmpfs for a memory volume). The walk
// follows no symlink and reaches nothing by path below the volume
// (du.Measure).
func (p *plugin) VolumeStats(ctx context.Context, _ *podvol.VolumeSpec, volumePath, _ string) (volume.Stats, bool, error) {
	s, err := du.Measure(ctx, p.rfs, volumePath)
	if err != nil {
		return volume.Stats{}, false, fmt.Errorf("measuring emptyDir volume at %s: %w", volumePath, err)
	}
	return s, true, nil
}
