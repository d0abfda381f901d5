package volume

import (
	"context"

	"github.com/nodevol/nodevol/internal/blockdev"
)

// BlockMap is what a BlockMapper's Map and Unmap are given: DevicePath,
// the device (where a CSI driver published it, or a local PV's device);
// GlobalMapPath and PodUID, the volume's directory of map files and the
// pod's file in it; PodDeviceDir and Name, the symlink the pod sees. It is
// an alias of the default mapper's type (internal/blockdev), so that the
// default implements BlockMapper and an embedder's mapper can name it.
type BlockMap = blockdev.Map

// BlockMapper maps raw block devices into pods and back, for every plugin
// of raw block volumes (the CSI and local PV plugins): one mapper serves
// them all. The default is internal/blockdev.Mapper (a bind mount of the
// device and a loop device holding it open); the plugins check the paths
// they hand to any BlockMapper for symlinks first.
type BlockMapper interface {
	Map(ctx context.Context, m BlockMap) error
	Unmap(ctx context.Context, m BlockMap) error
}
