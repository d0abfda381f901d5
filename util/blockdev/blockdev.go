// Package blockdev maps raw block devices into pods the way the kubelet's
// volumepathhandler does: the device a CSI driver published is bind-mounted
// to a file under the volume's global map path, held open by a loop device
// attached to that file (so that it cannot be replaced under the pod), and
// symlinked into the pod's device directory. Unmapping runs backwards.
// Every system interaction goes through an interface, so unit tests need no
// root.
package blockdev

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"k8s.io/mount-utils"
)

// Looper attaches loop devices to files.
type Looper interface {
	// Attach attaches a loop device to path and returns it.
	Attach(ctx context.Context, path string) (string, error)
	// Find returns the loop device attached to path, or "" if none is.
	Find(ctx context.Context, path string) (string, error)
	// Detach detaches the loop device dev.
	Detach(ctx context.Context, dev string) error
}

// Mapper maps and unmaps block devices for pods.
type Mapper struct {
	// Mounter makes and removes the bind mounts.
	Mounter mount.Interface
	// Loop makes the descriptor locks.
	Loop Looper
	// IsBlockDevice tells whether path is a block device (following
	// symlinks and bind mounts). Default: stat.
	IsBlockDevice func(path string) (bool, error)
}

// NewMapper returns a Mapper that uses m for bind mounts and losetup for
// loop devices.
func NewMapper(m mount.Interface) *Mapper {
	return &Mapper{Mounter: m, Loop: NewLosetup(nil)}
}

// isBlockDevice is the default IsBlockDevice.
func isBlockDevice(path string) (bool, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return false, err
	}
	return fi.Mode()&fs.ModeDevice != 0 && fi.Mode()&fs.ModeCharDevice == 0, nil
}

// Map is one pod's mapping of a device.
type Map struct {
	// DevicePath is where the driver published the device (NodePublish's
	// target path).
	DevicePath string
	// GlobalMapPath is the volume's directory of map files; the pod's is
	// GlobalMapPath/PodUID.
	GlobalMapPath, PodUID string
	// PodDeviceDir/Name is the symlink the pod sees.
	PodDeviceDir, Name string
}

func (m Map) mapFile() string { return filepath.Join(m.GlobalMapPath, m.PodUID) }
func (m Map) link() string    { return filepath.Join(m.PodDeviceDir, m.Name) }

// Map bind-mounts DevicePath to GlobalMapPath/PodUID, attaches a loop
// device to that file as the descriptor lock, and symlinks
// PodDeviceDir/Name to DevicePath, each step only if not done yet, so that
// Map is idempotent. DevicePath must be a block device. A symlink that
// exists and points elsewhere is an error and stays as it is.
func (mp *Mapper) Map(ctx context.Context, m Map) error {
	isBlock := mp.IsBlockDevice
	if isBlock == nil {
		isBlock = isBlockDevice
	}
	ok, err := isBlock(m.DevicePath)
	if err != nil {
		return fmt.Errorf("mapping %s: %w", m.DevicePath, err)
	}
	if !ok {
		return fmt.Errorf("mapping %s: the driver published something that is not a block device", m.DevicePath)
	}
	if err := mp.bindMount(m); err != nil {
		return err
	}
	if dev, err := mp.Loop.Find(ctx, m.mapFile()); err != nil {
		return fmt.Errorf("mapping %s: looking for the loop device of %s: %w", m.DevicePath, m.mapFile(), err)
	} else if dev == "" {
		if _, err := mp.Loop.Attach(ctx, m.mapFile()); err != nil {
			return fmt.Errorf("mapping %s: locking %s with a loop device: %w", m.DevicePath, m.mapFile(), err)
		}
	}
	return symlink(m.DevicePath, m.link())
}

// bindMount bind-mounts DevicePath onto the map file, creating the file.
func (mp *Mapper) bindMount(m Map) error {
	file := m.mapFile()
	if err := os.MkdirAll(m.GlobalMapPath, 0o750); err != nil {
		return fmt.Errorf("mapping %s: %w", m.DevicePath, err)
	}
	notMnt, err := mp.Mounter.IsLikelyNotMountPoint(file)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		f, err := os.OpenFile(file, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o640)
		if err != nil {
			return fmt.Errorf("mapping %s: creating the map file: %w", m.DevicePath, err)
		}
		f.Close()
	case err != nil:
		return fmt.Errorf("mapping %s: checking %s: %w", m.DevicePath, file, err)
	case !notMnt:
		return nil // mapped already
	}
	if err := mp.Mounter.Mount(m.DevicePath, file, "", []string{"bind"}); err != nil {
		return fmt.Errorf("mapping %s: bind-mounting it to %s: %w", m.DevicePath, file, err)
	}
	return nil
}

// symlink makes link point to target, unless it already does.
func symlink(target, link string) error {
	if err := os.MkdirAll(filepath.Dir(link), 0o750); err != nil {
		return err
	}
	cur, err := os.Readlink(link)
	switch {
	case err == nil && cur == target:
		return nil
	case err == nil:
		return fmt.Errorf("%s points to %s, not %s: not nodevol's, left as it is", link, cur, target)
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%s exists and is not a symlink (%w): left as it is", link, err)
	}
	return os.Symlink(target, link)
}

// Unmap undoes Map backwards: it removes the symlink (only if it points to
// DevicePath), detaches the loop device attached to the map file (if one
// still is), unmounts the map file and removes it, and removes
// PodDeviceDir and GlobalMapPath if they are empty. Missing pieces are not
// errors: Unmap is idempotent.
func (mp *Mapper) Unmap(ctx context.Context, m Map) error {
	if err := removeSymlink(m.DevicePath, m.link()); err != nil {
		return err
	}
	file := m.mapFile()
	if _, err := os.Lstat(file); err == nil {
		dev, err := mp.Loop.Find(ctx, file)
		if err != nil {
			return fmt.Errorf("unmapping %s: looking for the loop device of %s: %w", m.DevicePath, file, err)
		}
		if dev != "" {
			if err := mp.Loop.Detach(ctx, dev); err != nil {
				return fmt.Errorf("unmapping %s: detaching loop device %s: %w", m.DevicePath, dev, err)
			}
		}
		if err := mount.CleanupMountPoint(file, mp.Mounter, false); err != nil {
			return fmt.Errorf("unmapping %s: unmounting %s: %w", m.DevicePath, file, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("unmapping %s: %w", m.DevicePath, err)
	}
	removeIfEmpty(m.PodDeviceDir)
	removeIfEmpty(m.GlobalMapPath)
	return nil
}

// removeSymlink removes link if it points to target; a link pointing
// elsewhere, or anything that is not a symlink, is an error and stays.
func removeSymlink(target, link string) error {
	cur, err := os.Readlink(link)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("unmapping %s: %s is not a symlink (%w): left as it is", target, link, err)
	case cur != target:
		return fmt.Errorf("unmapping %s: %s points to %s: not nodevol's, left as it is", target, link, cur)
	}
	if err := os.Remove(link); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("unmapping %s: %w", target, err)
	}
	return nil
}

// removeIfEmpty removes dir if it is an empty directory.
func removeIfEmpty(dir string) {
	_ = os.Remove(dir) // fails, harmlessly, when not empty or gone
}
