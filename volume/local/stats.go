package local

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/internal/du"
)

// VolumeStats implements volume.StatsProvider. For a Filesystem volume it
// is statfs of the pod's mount, as the kubelet's MetricsStatFS: the
// capacity, free and used bytes and inodes of the filesystem the PV's
// path is on (shared with whatever else is on it, for a directory). For a
// Block volume it is the device's size only (the kubelet's MetricsBlock).
func (p *plugin) VolumeStats(_ context.Context, spec *podvol.VolumeSpec, volumePath, _ string) (volume.Stats, bool, error) {
	none := volume.Stats{CapacityBytes: -1, AvailableBytes: -1, UsedBytes: -1, Inodes: -1, InodesFree: -1, InodesUsed: -1}
	if spec.Mode == podvol.Block {
		target, err := p.rfs.Readlink(volumePath)
		if err != nil {
			return none, false, fmt.Errorf("stats of block volume %s: %w", desc(spec), err)
		}
		f, err := os.Open(target)
		if err != nil {
			return none, false, fmt.Errorf("stats of block volume %s: %w", desc(spec), err)
		}
		defer f.Close()
		size, err := f.Seek(0, io.SeekEnd)
		if err != nil {
			return none, false, fmt.Errorf("stats of block volume %s: size of %s: %w", desc(spec), target, err)
		}
		none.CapacityBytes = size
		return none, true, nil
	}
	d, err := p.rfs.OpenDir(volumePath)
	if err != nil {
		return none, false, fmt.Errorf("stats of volume %s: %w", desc(spec), err)
	}
	defer d.Close()
	u, err := du.Statfs(d)
	if err != nil {
		return none, false, fmt.Errorf("stats of volume %s: %w", desc(spec), err)
	}
	return u, true, nil
}
