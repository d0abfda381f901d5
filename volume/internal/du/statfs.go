package du

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/nodevol/nodevol/volume"
)

// Statfs returns the usage of the file system that the open directory d
// is on, as the kubelet's MetricsStatFS reports a volume's: capacity and
// used from all blocks, available from those an unprivileged user may
// take, and the inodes. The directory is given open so that no path is
// resolved again.
func Statfs(d *os.File) (volume.Stats, error) {
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(d.Fd()), &st); err != nil {
		return volume.Stats{}, fmt.Errorf("statfs %s: %w", d.Name(), err)
	}
	bs := st.Bsize
	return volume.Stats{
		CapacityBytes:  int64(st.Blocks) * bs,
		AvailableBytes: int64(st.Bavail) * bs,
		UsedBytes:      int64(st.Blocks-st.Bfree) * bs,
		Inodes:         int64(st.Files),
		InodesFree:     int64(st.Ffree),
		InodesUsed:     int64(st.Files - st.Ffree),
	}, nil
}
