package csiplugin

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strings"

	"github.com/nodevol/nodevol/util/rootfs"
)

// volumeDataTempPrefix starts the name of the temporary file
// rootfs.WriteFileAtomic writes vol_data.json through before renaming it.
const volumeDataTempPrefix = "." + VolumeDataFile + ".tmp-"

// RemoveWriteLeftovers removes from volume directory dir (relative to the
// root) the temporary files of vol_data.json writes that a crash cut short
// (nodevol killed between creating one and renaming it). The kubelet
// removes a volume directory with rmdir after deleting the files it knows,
// so such a file would fail every teardown of that volume once the node
// has moved to the kubelet, and it is a stranger to nodevol's own
// teardown. Only regular files of that name go; a missing directory is not
// an error. It returns the first error and goes on with the others.
func RemoveWriteLeftovers(r *rootfs.Root, dir string) error {
	list, err := r.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listing %s for the leftovers of a vol_data.json write: %w", dir, err)
	}
	var first error
	for _, e := range list {
		if !strings.HasPrefix(e.Name(), volumeDataTempPrefix) || !e.Type().IsRegular() {
			continue
		}
		if err := r.Remove(path.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) && first == nil {
			first = fmt.Errorf("removing the leftover of a vol_data.json write: %w", err)
		}
	}
	return first
}
