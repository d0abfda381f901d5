// Package blockdev maps raw block devices into pods the way the kubelet's
// volumepathhandler does: the device a CSI driver published is bind-mounted
// to a file under the volume's global map path, held open by a loop device
// attached to that file (so that it cannot be replaced under the pod), and
// symlinked into the pod's device directory. Unmapping runs backwards.
// Every system interaction goes through an interface, so unit tests need no
// root. With Mapper.Root set, every path of a Map must be under that root
// and is reached without following a symlink below it (internal/rootfs);
// Map.Verify is that check, which the plugins make before they hand a Map
// to any mapper.
package blockdev

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/internal/rootfs"
	"github.com/nodevol/nodevol/step"
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
	// Root, when set, confines the Mapper: every path of a Map must be
	// under it, and every directory, file and symlink the Mapper creates,
	// checks, mounts on or removes is reached without following a symlink
	// below it; a symlink in the way is an error (wrapping
	// rootfs.ErrSymlink) and nothing is done through it. The paths the
	// Mapper hands to the mounter and to losetup are checked right before.
	// Default nil: plain paths, symlinks followed.
	Root *rootfs.Root
	// Steps, if set, sees each loop device attach and detach before it is
	// made (package step); Root's and Mounter's own hooks see the rest.
	Steps step.Hook
}

// files is the Mapper's file-system access: plain, or confined to Root.
type files interface {
	mkdirAll(path string) error
	create(path string) error // an empty regular file; fs.ErrExist if anything is there
	lstat(path string) (fs.FileInfo, error)
	readlink(path string) (string, error)
	symlink(target, path string) error
	removeLink(path string) error  // only a symlink
	removeEmpty(path string) error // a regular file or an empty directory
	verify(path string) error      // no symlink on the way (nil for plain paths)
}

func (mp *Mapper) files() files {
	if mp.Root != nil {
		return rootFiles{mp.Root}
	}
	return plainFiles{}
}

type plainFiles struct{}

func (plainFiles) mkdirAll(path string) error { return os.MkdirAll(path, 0o750) }
func (plainFiles) create(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o640)
	if err != nil {
		return err
	}
	return f.Close()
}
func (plainFiles) lstat(path string) (fs.FileInfo, error) { return os.Lstat(path) }
func (plainFiles) readlink(path string) (string, error)   { return os.Readlink(path) }
func (plainFiles) symlink(target, path string) error      { return os.Symlink(target, path) }
func (plainFiles) removeLink(path string) error           { return os.Remove(path) }
func (plainFiles) removeEmpty(path string) error          { return os.Remove(path) }
func (plainFiles) verify(string) error                    { return nil }

type rootFiles struct{ r *rootfs.Root }

func (f rootFiles) mkdirAll(path string) error             { return f.r.MkdirAll(path, 0o750) }
func (f rootFiles) create(path string) error               { return f.r.Create(path, 0o640) }
func (f rootFiles) lstat(path string) (fs.FileInfo, error) { return f.r.Lstat(path) }
func (f rootFiles) readlink(path string) (string, error)   { return f.r.Readlink(path) }
func (f rootFiles) symlink(target, path string) error      { return f.r.Symlink(target, path) }
func (f rootFiles) removeLink(path string) error           { return f.r.RemoveLink(path) }
func (f rootFiles) removeEmpty(path string) error          { return f.r.Remove(path) }
func (f rootFiles) verify(path string) error               { _, err := f.r.Verify(path); return err }

// In returns a copy of mp confined to r instead of mp.Root: the Mapper of
// one operation whose root is held for it (rootfs.Root.Hold), whose paths
// are then all resolved from that one handle.
func (mp *Mapper) In(r *rootfs.Root) *Mapper {
	c := *mp
	c.Root = r
	return &c
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
	fsys := mp.files()
	// Every path first, so that a symlink anywhere refuses the whole map
	// before anything is mounted or created.
	if err := m.verify(fsys, []string{m.DevicePath, m.GlobalMapPath, m.mapFile(), m.PodDeviceDir}); err != nil {
		return fmt.Errorf("mapping %s: %w", m.DevicePath, err)
	}
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
	if err := mp.bindMount(fsys, m); err != nil {
		return err
	}
	if dev, err := mp.Loop.Find(ctx, m.mapFile()); err != nil {
		return fmt.Errorf("mapping %s: looking for the loop device of %s: %w", m.DevicePath, m.mapFile(), err)
	} else if dev == "" {
		if err := fsys.verify(m.mapFile()); err != nil {
			return fmt.Errorf("mapping %s: %w", m.DevicePath, err)
		}
		if err := mp.Steps.Take(step.LoopAttach, m.mapFile()); err != nil {
			return fmt.Errorf("mapping %s: %w", m.DevicePath, err)
		}
		if _, err := mp.Loop.Attach(ctx, m.mapFile()); err != nil {
			return fmt.Errorf("mapping %s: locking %s with a loop device: %w", m.DevicePath, m.mapFile(), err)
		}
	}
	if err := symlink(fsys, m.DevicePath, m.link()); err != nil {
		return fmt.Errorf("mapping %s: %w", m.DevicePath, err)
	}
	return nil
}

// Verify checks that none of m's paths under r goes through a symlink:
// DevicePath (a device outside r, as a local PV's /dev/sdb, is only read
// and needs no confinement; "" is not checked), GlobalMapPath, the pod's
// map file in it, and PodDeviceDir (the pod's device path is a symlink by
// design: its directory is checked). A plugin calls it right before it
// hands m to a mapper, its own or an embedder's; Map checks the same.
func (m Map) Verify(r *rootfs.Root) error {
	paths := []string{m.GlobalMapPath, m.mapFile(), m.PodDeviceDir}
	if m.DevicePath != "" {
		paths = append([]string{m.DevicePath}, paths...)
	}
	return m.verify(rootFiles{r}, paths)
}

// verify checks paths, some of m's, through fsys.
func (m Map) verify(fsys files, paths []string) error {
	for _, p := range paths {
		if err := verifyPath(fsys, p, m.DevicePath); err != nil {
			return err
		}
	}
	return nil
}

// bindMount bind-mounts DevicePath onto the map file, creating the file.
func (mp *Mapper) bindMount(fsys files, m Map) error {
	file := m.mapFile()
	if err := fsys.mkdirAll(m.GlobalMapPath); err != nil {
		return fmt.Errorf("mapping %s: %w", m.DevicePath, err)
	}
	if err := fsys.verify(file); err != nil {
		return fmt.Errorf("mapping %s: %w", m.DevicePath, err)
	}
	notMnt, err := mp.Mounter.IsLikelyNotMountPoint(file)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := fsys.create(file); err != nil {
			return fmt.Errorf("mapping %s: creating the map file: %w", m.DevicePath, err)
		}
	case err != nil:
		return fmt.Errorf("mapping %s: checking %s: %w", m.DevicePath, file, err)
	case !notMnt:
		return nil // mapped already
	}
	for _, p := range []string{m.DevicePath, file} {
		if err := verifyPath(fsys, p, m.DevicePath); err != nil {
			return fmt.Errorf("mapping %s: %w", m.DevicePath, err)
		}
	}
	if err := mp.Mounter.Mount(m.DevicePath, file, "", []string{"bind"}); err != nil {
		return fmt.Errorf("mapping %s: bind-mounting it to %s: %w", m.DevicePath, file, err)
	}
	return nil
}

// verifyPath checks that no symlink is on the way to p under the root. The
// device may lie outside the root (a local PV's /dev/sdb): it is only a
// mount source and a symlink target, never created or removed, so it
// needs no confinement.
func verifyPath(fsys files, p, device string) error {
	err := fsys.verify(p)
	if p == device && errors.Is(err, rootfs.ErrOutside) {
		return nil
	}
	return err
}

// symlink makes link point to target, unless it already does.
func symlink(fsys files, target, link string) error {
	if err := fsys.mkdirAll(filepath.Dir(link)); err != nil {
		return err
	}
	cur, err := fsys.readlink(link)
	switch {
	case err == nil && cur == target:
		return nil
	case err == nil:
		return fmt.Errorf("%s points to %s, not %s: not nodevol's, left as it is", link, cur, target)
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%s exists and is not a symlink (%w): left as it is", link, err)
	}
	return fsys.symlink(target, link)
}

// Unmap undoes Map backwards: it removes the symlink (only if it points to
// DevicePath), detaches the loop device attached to the map file (if one
// still is), unmounts the map file and removes it, and removes
// PodDeviceDir and GlobalMapPath if they are empty. Missing pieces are not
// errors: Unmap is idempotent.
func (mp *Mapper) Unmap(ctx context.Context, m Map) error {
	fsys := mp.files()
	for _, p := range []string{m.GlobalMapPath, m.mapFile(), m.PodDeviceDir} {
		if err := fsys.verify(p); err != nil {
			return fmt.Errorf("unmapping %s: %w", m.DevicePath, err)
		}
	}
	if err := removeSymlink(fsys, m.DevicePath, m.link()); err != nil {
		return err
	}
	file := m.mapFile()
	if _, err := fsys.lstat(file); err == nil {
		dev, err := mp.Loop.Find(ctx, file)
		if err != nil {
			return fmt.Errorf("unmapping %s: looking for the loop device of %s: %w", m.DevicePath, file, err)
		}
		if dev != "" {
			if err := mp.Steps.Take(step.LoopDetach, dev+" "+file); err != nil {
				return fmt.Errorf("unmapping %s: %w", m.DevicePath, err)
			}
			if err := mp.Loop.Detach(ctx, dev); err != nil {
				return fmt.Errorf("unmapping %s: detaching loop device %s: %w", m.DevicePath, dev, err)
			}
			if err := mp.released(ctx, dev, file); err != nil {
				return fmt.Errorf("unmapping %s: %w", m.DevicePath, err)
			}
		}
		if err := CleanupMountPoint(mp.Root, mp.Mounter, file); err != nil {
			return fmt.Errorf("unmapping %s: unmounting %s: %w", m.DevicePath, file, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("unmapping %s: %w", m.DevicePath, err)
	}
	removeIfEmpty(fsys, m.PodDeviceDir)
	removeIfEmpty(fsys, m.GlobalMapPath)
	return nil
}

// releaseTimeout bounds the wait for a detached loop device to let go of
// its map file (released); past it, the unmap fails and is retried.
const releaseTimeout = 10 * time.Second

// released waits until no loop device holds file. losetup --detach of a
// loop device that something still has open (udev probing it after the
// change, a reader of the pod's device) only marks it to be cleared when
// the last opener closes it, and returns: until then the device holds the
// map file, and unmounting the map file fails with "target is busy". The
// kubelet unmounts at once and retries the failed unmap after its backoff;
// nodevol waits for the condition instead, so a teardown under load is one
// unmount, not a logged failure and a retry.
func (mp *Mapper) released(ctx context.Context, dev, file string) error {
	err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, releaseTimeout, true, func(ctx context.Context) (bool, error) {
		held, err := mp.Loop.Find(ctx, file)
		return held == "", err
	})
	if err != nil {
		return fmt.Errorf("loop device %s still holds %s after it was detached: %w", dev, file, err)
	}
	return nil
}

// removeSymlink removes link if it points to target; a link pointing
// elsewhere, or anything that is not a symlink, is an error and stays.
func removeSymlink(fsys files, target, link string) error {
	cur, err := fsys.readlink(link)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("unmapping %s: %s is not a symlink (%w): left as it is", target, link, err)
	case cur != target:
		return fmt.Errorf("unmapping %s: %s points to %s: not nodevol's, left as it is", target, link, cur)
	}
	if err := fsys.removeLink(link); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("unmapping %s: %w", target, err)
	}
	return nil
}

// removeIfEmpty removes dir if it is an empty directory.
func removeIfEmpty(fsys files, dir string) {
	_ = fsys.removeEmpty(dir) // fails, harmlessly, when not empty or gone
}

// CleanupMountPoint unmounts path if it is a mount point and removes it,
// as mount.CleanupMountPoint(path, m, false) does. With r set, path is
// checked for symlinks under r before each step, and removed only if it is
// a regular file or an empty directory (rootfs.Root.Remove); a symlink is
// an error and stays. A missing path is not an error.
func CleanupMountPoint(r *rootfs.Root, m mount.Interface, path string) error {
	if r == nil {
		return mount.CleanupMountPoint(path, m, false)
	}
	for unmounted := false; ; unmounted = true {
		if _, err := r.Verify(path); err != nil {
			return err
		}
		notMnt, err := m.IsLikelyNotMountPoint(path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return nil
		case err != nil && (unmounted || !mount.IsCorruptedMnt(err)):
			return err
		case err == nil && notMnt:
			if err := r.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			return nil
		case unmounted:
			return fmt.Errorf("failed to unmount path %v", path)
		}
		if err := m.Unmount(path); err != nil {
			return err
		}
	}
}
