package csiplugin

import "github.com/nodevol/nodevol/internal/blockdev"

// BlockMap is what a BlockMapper's Map and Unmap are given: DevicePath,
// where the driver published the device (NodePublishVolume's target path);
// GlobalMapPath and PodUID, the volume's directory of map files and the
// pod's file in it; PodDeviceDir and Name, the symlink the pod sees. It is
// an alias of the default mapper's type (internal/blockdev), so that the
// default implements BlockMapper and an embedder's mapper can name it.
type BlockMap = blockdev.Map
