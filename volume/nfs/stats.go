package nfs

import (
	"context"
	"fmt"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/internal/du"
)

// VolumeStats implements volume.StatsProvider as the kubelet's
// MetricsStatFS: statfs of the pod's mount, the export's file system as
// the server reports it (shared with whatever else the export holds). The
// directory is opened without following a symlink below the root. As for
// the kubelet, a hard mount whose server does not answer may block.
func (p *plugin) VolumeStats(_ context.Context, spec *podvol.VolumeSpec, volumePath, _ string) (volume.Stats, bool, error) {
	none := volume.Stats{CapacityBytes: -1, AvailableBytes: -1, UsedBytes: -1, Inodes: -1, InodesFree: -1, InodesUsed: -1}
	fail := func(err error) (volume.Stats, bool, error) {
		return none, false, fmt.Errorf("stats of nfs volume %s at %s: %w", spec.Name, volumePath, err)
	}
	d, err := p.rfs.OpenDir(volumePath)
	if err != nil {
		return fail(err)
	}
	defer d.Close()
	st, err := du.Statfs(d)
	if err != nil {
		return fail(err)
	}
	return st, true, nil
}
