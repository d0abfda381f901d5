package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
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
	loops, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, f := range loops {
		data, err := os.ReadFile(f)
		if err != nil {
			continue // detached meanwhile
		}
		backing := strings.TrimSpace(string(data))
		for _, d := range made {
			if strings.HasPrefix(backing, d+"/") {
				dev := "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(f)))
				if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
					errs = append(errs, fmt.Errorf("detaching %s (%s): %w: %s", dev, backing, err, out))
				} else {
					cleaned = append(cleaned, dev+" ("+backing+")")
				}
			}
		}
	}
	for _, d := range made {
		if err := os.Remove(d); err != nil {
			errs = append(errs, fmt.Errorf("left by the local volume specs, not removed: %w", err))
		} else {
			cleaned = append(cleaned, d)
		}
	}
	return cleaned, errors.Join(errs...)
}
