package ondisk

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strings"

	"github.com/nodevol/nodevol/internal/fsutil"
	"github.com/nodevol/nodevol/internal/rootfs"
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

// RemoveUnusedVolumeDir removes volume directory dir (relative to r) when
// nothing in it can hold data, and its record: a pod volume directory
// (leaf "mount") or a staging directory (leaf "globalmount") that holds
// nothing but vol_data.json (readable or not), the temporary files of its
// writes and an empty leaf, with neither dir nor anything in it a mount
// point (isMountPoint, given an absolute path, says so from the mount
// table). That is what a reboot leaves, and what a stop between creating
// the directory and writing vol_data.json leaves (SetUp, MountDevice).
//
// Everything is checked before anything is removed, so that a directory
// that is left keeps its vol_data.json, and the error says what was
// found. The leaf goes first, and only as an empty directory: a mount
// point the table missed cannot be removed (rmdir fails with EBUSY), and
// then nothing else is. No symlink is followed.
func RemoveUnusedVolumeDir(r *rootfs.Root, isMountPoint func(path string) bool, dir, leaf string) error {
	abs, err := r.Join(dir)
	if err != nil {
		return err
	}
	if isMountPoint(abs) {
		return fmt.Errorf("%s is a mount point", abs)
	}
	entries, err := r.ReadDir(dir)
	if err != nil {
		return err
	}
	names := []string{leaf}
	for _, e := range entries {
		name := e.Name()
		switch p := path.Join(abs, name); {
		case isMountPoint(p):
			return fmt.Errorf("%s is a mount point", p)
		case name == leaf && e.IsDir():
			in, err := r.ReadDir(path.Join(dir, leaf))
			if err != nil {
				return err
			}
			if len(in) > 0 {
				return fmt.Errorf("%s is not empty", p)
			}
		case (name == VolumeDataFile || strings.HasPrefix(name, volumeDataTempPrefix)) && e.Type().IsRegular():
			names = append(names, name)
		default:
			return fmt.Errorf("%s holds %s, which nodevol did not write", abs, name)
		}
	}
	if err := r.RemoveIn(dir, names...); err != nil {
		return err
	}
	if err := r.RemoveAny(RecordFile(dir)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removed %s, but not its record: %w", abs, err)
	}
	return nil
}

// IsStagingDirName tells whether name, in driver's directory of the CSI
// plugin's directory, is named as StagingDir names a staging directory
// (the hex SHA-256 of a volume handle), and so may be one that a stop cut
// short before its vol_data.json was written. The raw block tree
// (volumeDevices) and an older kubelet's pv/{pvName} are not.
func IsStagingDirName(driver, name string) bool {
	if driver == volumeDevicesDir || len(name) != sha256.Size*2 {
		return false
	}
	for _, c := range name {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// RemoveUnusedBlockDir removes raw block volume directory
// volumeDevices/{specName} when it holds nothing: no vol_data.json, no map
// file, nothing but an empty data/ and an empty dev/. That is what a stop
// leaves between creating data/ and renaming vol_data.json into it
// (SetUpDevice, MapPodDevice), or between removing vol_data.json and the
// directory (TearDownDevice); nothing else names such a directory, so it
// would stay for good. The temporary files of vol_data.json writes must be
// gone first (RemoveWriteLeftovers). Only empty directories are removed
// (rmdir), so a mount point, a map file or anything else stays, and the
// error says what was found. No symlink is followed.
func RemoveUnusedBlockDir(r *rootfs.Root, specName string) error {
	if err := fsutil.ValidateName("spec name", specName); err != nil {
		return err
	}
	dir := path.Join(pluginDir, volumeDevicesDir, specName)
	entries, err := r.ReadDir(dir)
	if err != nil {
		return err
	}
	var names []string
	for _, e := range entries {
		sub := path.Join(dir, e.Name())
		if (e.Name() != "data" && e.Name() != "dev") || !e.IsDir() {
			return fmt.Errorf("%s holds %s, which nodevol did not write", dir, e.Name())
		}
		in, err := r.ReadDir(sub)
		if err != nil {
			return err
		}
		if len(in) > 0 {
			return fmt.Errorf("%s is not empty: it holds %s", sub, in[0].Name())
		}
		names = append(names, e.Name())
	}
	return r.RemoveIn(dir, names...)
}
