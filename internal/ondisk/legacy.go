package ondisk

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"path/filepath"

	"github.com/nodevol/nodevol/internal/fsutil"
	"github.com/nodevol/nodevol/internal/rootfs"
)

// legacyPVDir is the directory, under the CSI plugin's, where older
// kubelets staged volumes by PV name.
const legacyPVDir = "pv"

// LegacyStagingDir returns the directory older kubelets staged a PV's
// volume in, holding its globalmount and vol_data.json:
// {root}/plugins/kubernetes.io/csi/pv/{pvName}. nodevol never creates it;
// it stages there only what an older kubelet staged there (see
// FindLegacyStaging).
func LegacyStagingDir(root, pvName string) (string, error) {
	if err := fsutil.ValidateName("PV name", pvName); err != nil {
		return "", err
	}
	return legacyDir(root, pvName), nil
}

// legacyDir is LegacyStagingDir of a PV name checked already.
func legacyDir(root, pvName string) string {
	return filepath.Join(root, pluginDir, legacyPVDir, pvName)
}

// FindLegacyStaging reports whether an older kubelet staged the volume of
// PV pvName (driver, volume handle) in LegacyStagingDir: its globalmount
// exists there and the vol_data.json beside it names the same driver and
// handle. A PV name reused for another volume, a missing or unreadable
// vol_data.json, or no globalmount: not found. The directory it returns is
// built on root, as given. Nothing is followed through a symlink below r:
// a symlink on the way (or as globalmount) is an error naming it, so that
// the volume is not staged a second time elsewhere.
func FindLegacyStaging(r *rootfs.Root, root, pvName, driver, volumeHandle string) (dir string, ok bool, err error) {
	if pvName == "" || fsutil.ValidateName("PV name", pvName) != nil {
		return "", false, nil
	}
	rel := path.Join(pluginDir, legacyPVDir, pvName)
	fi, err := r.Stat(path.Join(rel, StagingLeaf))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("checking the legacy staging path of PV %s: %w", pvName, err)
	case !fi.IsDir():
		return "", false, nil
	}
	d, err := readVolumeData(r, rel)
	switch {
	case errors.Is(err, rootfs.ErrSymlink):
		return "", false, fmt.Errorf("checking the legacy staging path of PV %s: %w", pvName, err)
	case err != nil:
		return "", false, nil
	case d.DriverName != driver || d.VolumeHandle != volumeHandle:
		return "", false, nil
	}
	return legacyDir(root, pvName), true, nil
}

// FindStagingDir returns the directory a file-system volume (driver,
// volume handle, PV pvName) is (to be) staged in: the legacy one when an
// older kubelet staged it there (FindLegacyStaging), else StagingDir.
// legacy says which.
func FindStagingDir(r *rootfs.Root, root, pvName, driver, volumeHandle string) (dir string, legacy bool, err error) {
	dir, legacy, err = FindLegacyStaging(r, root, pvName, driver, volumeHandle)
	if err != nil || legacy {
		return dir, legacy, err
	}
	dir, err = StagingDir(root, driver, volumeHandle)
	return dir, false, err
}
