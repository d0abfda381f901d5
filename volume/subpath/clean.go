package subpath

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"
)

// maxStacked bounds the unmounts of one target: mounts stacked there by
// Prepares that crashed before they could check (the kubelet unmounts
// once and fails if a mount is left).
const maxStacked = 8

// CleanVolume unmounts and removes every subPath bind mount of the pod's
// volume (all containers, all indexes) and their directories, as the
// kubelet's CleanSubPaths does for one volume before it tears the volume
// down: a bind mount left there keeps a reference to the volume's mount,
// and an unstage would be refused for as long as it stays. volume is the
// name Prepare took as Mount.Volume.
//
// It follows no symlink below the root. It removes mount points (once
// unmounted), the targets Prepare makes (empty directories and empty
// files) and the kubelet's directories once empty, and nothing else:
// anything else it finds stays, and the error names it. An error means
// something is left, which the error names; the volume must not be torn
// down then. Idempotent; a pod or volume with no subPath directory is not
// an error. The pod's volume-subpaths directory goes too when it is left
// empty.
func (m *Manager) CleanVolume(ctx context.Context, pod types.UID, volume string) error {
	if err := validateNames(pod, volume); err != nil {
		return fmt.Errorf("cleaning the subPath bind mounts of pod %s volume %q: %w", pod, volume, err)
	}
	defer m.locks.lock(pod)()
	m, release, err := m.withRootHeld()
	if err != nil {
		return fmt.Errorf("cleaning the subPath bind mounts of pod %s volume %q: %w", pod, volume, err)
	}
	defer release()
	if err := m.cleanVolume(ctx, pod, volume); err != nil {
		return err
	}
	return m.removeEmptyDirs(podSubPathsDir(pod))
}

// CleanPod is CleanVolume for every volume in the pod's volume-subpaths
// directory, which it then removes. An error names what is left.
func (m *Manager) CleanPod(ctx context.Context, pod types.UID) error {
	if err := validateNames(pod, "-"); err != nil {
		return fmt.Errorf("cleaning the subPath bind mounts of pod %s: %w", pod, err)
	}
	defer m.locks.lock(pod)()
	m, release, err := m.withRootHeld()
	if err != nil {
		return fmt.Errorf("cleaning the subPath bind mounts of pod %s: %w", pod, err)
	}
	defer release()
	dir := podSubPathsDir(pod)
	entries, err := m.root.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cleaning the subPath bind mounts of pod %s: %w", pod, err)
	}
	var errs []error
	for _, e := range entries {
		if !e.IsDir() {
			errs = append(errs, m.leftError(filepath.Join(dir, e.Name())))
			continue
		}
		if err := m.cleanVolume(ctx, pod, e.Name()); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		if err := m.root.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("cleaning the subPath bind mounts of pod %s: %w", pod, err))
		}
	}
	return errors.Join(errs...)
}

// cleanVolume is CleanVolume, but for the pod's volume-subpaths directory.
func (m *Manager) cleanVolume(ctx context.Context, pod types.UID, volume string) error {
	dir := volumeDir(pod, volume)
	fail := func(err error) error {
		return fmt.Errorf("cleaning the subPath bind mounts of pod %s volume %q: %w", pod, volume, err)
	}
	containers, err := m.root.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fail(err)
	}
	var errs []error
	for _, c := range containers {
		cdir := filepath.Join(dir, c.Name())
		if !c.IsDir() {
			errs = append(errs, m.leftError(cdir))
			continue
		}
		if err := m.cleanContainer(ctx, cdir); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		if err := m.root.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fail(errors.Join(errs...))
	}
	klog.FromContext(ctx).V(4).Info("SubPath bind mounts cleaned", "pod", pod, "volume", volume)
	return nil
}

// cleanContainer cleans every target in a container's directory cdir,
// then removes cdir.
func (m *Manager) cleanContainer(ctx context.Context, cdir string) error {
	targets, err := m.root.ReadDir(cdir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, t := range targets {
		if err := m.cleanTarget(ctx, filepath.Join(cdir, t.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		if err := m.root.Remove(cdir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// cleanTarget unmounts what is mounted at name (relative to the root),
// however many times it is, and removes it if it is then what Prepare
// makes as a target: an empty directory or an empty regular file.
func (m *Manager) cleanTarget(ctx context.Context, name string) error {
	full, err := m.mountPath(name)
	if err != nil {
		return err
	}
	for n := 0; ; n++ {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%s: %w", full, err)
		}
		isMnt, err := m.mounter.IsMountPoint(full)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return nil
		case mount.IsCorruptedMnt(err):
			isMnt = true
		case err != nil:
			return fmt.Errorf("checking whether %s is a mount point: %w", full, err)
		}
		if !isMnt {
			break
		}
		if n == maxStacked {
			return fmt.Errorf("%s is still a mount point after %d unmounts", full, n)
		}
		if err := m.unmount(name); err != nil {
			return err
		}
	}
	return m.removeTarget(name)
}

// leftError is the error for name (relative to the root), which is not
// something CleanVolume removes.
func (m *Manager) leftError(name string) error {
	full, _ := m.root.Join(name)
	fi, err := m.root.Lstat(name)
	if err != nil {
		return err
	}
	return fmt.Errorf("%s (%v) is not a directory of subPath bind mounts: not removed", full, fi.Mode().Type())
}
