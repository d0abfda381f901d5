package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"
)

// localDriverGlob is where the suites' local volume specs make their
// directories, files and loop devices' backing files (test/e2e/storage/utils
// local.go), from a host-exec pod in the run's mount namespace: their
// mounts go with the namespace, the directories and loop devices would not.
const localDriverGlob = "/tmp/local-driver-*"

// localDriverDirs lists the directories matching glob (localDriverGlob)
// now there.
func localDriverDirs(glob string) (map[string]bool, error) {
	paths, err := filepath.Glob(glob)
	if err != nil {
		return nil, err
	}
	dirs := make(map[string]bool, len(paths))
	for _, p := range paths {
		dirs[p] = true
	}
	return dirs, nil
}

// cleanLocalDriverLeftovers takes down what the local volume specs made
// (in the directories matching glob, localDriverGlob)
// during the run and did not take down themselves (a spec interrupted or
// timed out before its clean-up): loop devices whose backing file is in
// one of their new directories are detached, and the directories removed
// when empty. A spec that ran to its end leaves nothing, so anything found
// is reported, and what could not be removed (a directory that still holds
// a file: the runner removes no data) is the error.
func cleanLocalDriverLeftovers(glob string, before map[string]bool) (cleaned []string, err error) {
	now, err := localDriverDirs(glob)
	if err != nil {
		return nil, err
	}
	var made []string
	for d := range now {
		if !before[d] {
			made = append(made, d)
		}
	}
	if len(made) == 0 {
		return nil, nil
	}
	slices.Sort(made)
	detached, err := detachLoopsUnder(made...)
	cleaned = append(cleaned, detached...)
	errs := []error{err}
	for _, d := range made {
		if err := os.Remove(d); err != nil {
			errs = append(errs, fmt.Errorf("left by the local volume specs, not removed: %w", err))
		} else {
			cleaned = append(cleaned, d)
		}
	}
	return cleaned, errors.Join(errs...)
}

// detachLoopsUnder detaches the loop devices whose backing file is below
// one of dirs and says which, "/dev/loopN (file)". A file is known by its
// device and inode, as the loop device has them (LOOP_GET_STATUS64): the
// path it shows is the one its maker saw, which for a CSI driver's pod is
// the container's.
func detachLoopsUnder(dirs ...string) ([]string, error) {
	type fileID struct{ dev, ino uint64 }
	files := map[fileID]string{}
	for _, d := range dirs {
		err := filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err != nil || !e.Type().IsRegular() {
				return err
			}
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); err != nil {
				return err
			}
			files[fileID{st.Dev, st.Ino}] = p
			return nil
		})
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}
	if len(files) == 0 {
		return nil, nil
	}
	devs, err := filepath.Glob("/sys/block/loop*")
	if err != nil {
		return nil, err
	}
	var detached []string
	var errs []error
	for _, sys := range devs {
		dev := "/dev/" + filepath.Base(sys)
		f, err := os.Open(dev)
		if err != nil {
			continue // gone meanwhile
		}
		info, err := unix.IoctlLoopGetStatus64(int(f.Fd()))
		if err != nil { // ENXIO: not bound
			f.Close()
			continue
		}
		if p, ok := files[fileID{info.Device, info.Inode}]; ok {
			if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0); err != nil {
				errs = append(errs, fmt.Errorf("detaching %s (%s): %w", dev, p, err))
			} else {
				detached = append(detached, dev+" ("+p+")")
			}
		}
		f.Close()
	}
	return detached, errors.Join(errs...)
}
