package subpath

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/internal/rootfs"
	"github.com/nodevol/nodevol/step"
)

// Modes of what Prepare makes under the root: the kubelet's.
const (
	dirMode  = 0o750
	fileMode = 0o640
)

// Prepare makes the bind mount of s's subPath and returns its path, the
// host path to give the runtime for the volumeMount:
// {root}/pods/{uid}/volume-subpaths/{volume}/{container}/{index}.
//
// It opens the subPath below s.VolumePath, following the symlinks that
// stay in the volume and opening every component without following one
// (the subPath's own missing last components are first created as
// directories with the mode of the volume's root; nothing is created
// through a symlink whose target is missing), creates the target (a
// directory for a directory, an empty file for anything else),
// bind-mounts the opened file through its descriptor and checks that the
// mount is of that file (same device and inode); if it is not, the mount
// is taken down again and the error wraps errMismatch (errNotMounted when
// the mounter mounted nothing). The bind mount is read-write, as the
// kubelet's: a read-only volumeMount is made read-only by the runtime.
//
// An invalid s (ErrInvalid), a symlink that leaves the volume (errEscape),
// a symlink loop (unix.ELOOP) or one whose target is missing (each also
// ErrSymlink) is an error naming the pod, volume, container, subPath and
// the symlink, and nothing is created or mounted.
// Idempotent: an existing bind mount of the same file is reused; one of
// another file (a stale mount, left after the volume was mounted anew) is
// detached (a lazy unmount) and made again, as the kubelet 1.37 does. On
// an error after the target was made, the target and the directories it
// emptied are removed again (the step hook permitting).
func (m *Manager) Prepare(ctx context.Context, s Mount) (string, error) {
	fail := func(err error) (string, error) {
		return "", fmt.Errorf("preparing the subPath bind mount of %v: %w", s, err)
	}
	comps, err := s.validate()
	if err != nil {
		return fail(err)
	}
	target, err := m.root.Join(s.target())
	if err != nil {
		return fail(fmt.Errorf("%w: %w", ErrInvalid, err))
	}
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	defer m.locks.lock(s.Pod)()
	fd, mode, err := m.openSubPath(ctx, s, comps)
	if err != nil {
		return fail(err)
	}
	defer func() { _ = unix.Close(fd) }()
	if m.afterOpen != nil {
		m.afterOpen(fd)
	}
	reuse, err := m.checkTarget(ctx, fd, s.target())
	if err != nil {
		return fail(err)
	}
	if reuse {
		klog.FromContext(ctx).V(5).Info("SubPath already bind-mounted", "pod", s.Pod, "volume", s.Volume, "container", s.Container, "path", target)
		return target, nil
	}
	if err := m.bind(ctx, s, fd, mode == unix.S_IFDIR, target); err != nil {
		if cerr := m.undo(ctx, s, target); cerr != nil {
			err = errors.Join(err, fmt.Errorf("cleaning up: %w", cerr))
		}
		return fail(err)
	}
	klog.FromContext(ctx).V(4).Info("SubPath bind-mounted", "pod", s.Pod, "volume", s.Volume, "container", s.Container, "subPath", s.SubPath, "path", target)
	return target, nil
}

// openSubPath opens s's subPath (comps) below s.VolumePath, creating its
// missing last components as directories. It returns an O_PATH
// descriptor and the file's type.
func (m *Manager) openSubPath(ctx context.Context, s Mount, comps []string) (int, uint32, error) {
	volFd, err := unix.Open(s.VolumePath, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, 0, fmt.Errorf("opening the volume's directory %s: %w", s.VolumePath, err)
	}
	defer func() { _ = unix.Close(volFd) }()
	for created := false; ; created = true {
		w, err := openBeneath(volFd, s.VolumePath, comps, m.afterLink)
		if err != nil {
			return -1, 0, err
		}
		if len(w.missing) == 0 {
			return w.fd, w.mode, nil
		}
		if created {
			// Made and gone again before the open: let the caller retry.
			_ = unix.Close(w.fd)
			return -1, 0, fmt.Errorf("%s: removed while it was created: %w", filepath.Join(w.path, w.missing[0]), fs.ErrNotExist)
		}
		var st unix.Stat_t
		err = unix.Fstat(volFd, &st)
		if err == nil {
			err = m.mkdirBeneath(ctx, w, st.Mode&0o7777)
		}
		_ = unix.Close(w.fd)
		if err != nil {
			return -1, 0, fmt.Errorf("creating the subPath: %w", err)
		}
	}
}

// checkTarget looks at what is mounted at name (relative to the root):
// true when it is a bind mount of the file open as fd. A corrupted mount
// or a mount of another file is unmounted (each of them, when they are
// stacked), and false returned. A mount of another file (a stale one, of
// a volume mounted anew) is detached, as the kubelet 1.37 lazy-unmounts
// it: a plain unmount would wait on a hung FUSE flush, or fail while a
// container still holds a file in it, and the pod would never start
// again.
func (m *Manager) checkTarget(ctx context.Context, fd int, name string) (bool, error) {
	target, err := m.mountPath(name)
	if err != nil {
		return false, err
	}
	for n := 0; n < maxStacked; n++ {
		isMnt, err := m.mounter.IsMountPoint(target)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return false, nil
		case mount.IsCorruptedMnt(err):
			klog.FromContext(ctx).Info("Unmounting a corrupted subPath mount", "path", target, "err", err)
		case err != nil:
			return false, fmt.Errorf("checking whether %s is a mount point: %w", target, err)
		case !isMnt:
			return false, nil
		default:
			same, err := m.isFile(fd, target)
			if err != nil || same {
				return same, err
			}
			klog.FromContext(ctx).V(4).Info("Detaching a stale subPath mount: it is of another file", "path", target)
			if err := m.detachStale(name); err != nil {
				return false, err
			}
			continue
		}
		if err := m.unmount(name); err != nil {
			return false, err
		}
	}
	return false, fmt.Errorf("%s is still a mount point after %d unmounts", target, maxStacked)
}

// mountPath returns the absolute path of name (relative to the root), to
// hand to the mounter right away: no component of it below the root is a
// symlink. It does not open or stat name itself, but reads its type from
// its directory: a corrupted mount there (a dead FUSE daemon, a stale NFS
// handle) fails a stat, and must still be unmounted.
func (m *Manager) mountPath(name string) (string, error) {
	full, err := m.root.Join(name)
	if err != nil {
		return "", err
	}
	entries, err := m.root.ReadDir(filepath.Dir(name))
	if errors.Is(err, fs.ErrNotExist) {
		return full, nil
	}
	if err != nil {
		return "", err
	}
	base := filepath.Base(name)
	i, found := slices.BinarySearchFunc(entries, base, func(e fs.DirEntry, b string) int { return strings.Compare(e.Name(), b) })
	if found && entries[i].Type()&fs.ModeSymlink != 0 {
		return "", &rootfs.PathError{Op: "verify", Path: full, Component: full, Err: rootfs.ErrSymlink}
	}
	return full, nil
}

// unmount unmounts name (relative to the root) once.
func (m *Manager) unmount(name string) error {
	target, err := m.mountPath(name)
	if err != nil {
		return err
	}
	if err := m.mounter.Unmount(target); err != nil {
		return fmt.Errorf("unmounting %s: %w", target, err)
	}
	return nil
}

// detachStale lazily unmounts name (relative to the root) once: the
// mount leaves the tree at once and goes when no one uses it any more.
func (m *Manager) detachStale(name string) error {
	target, err := m.mountPath(name)
	if err != nil {
		return err
	}
	if err := m.steps.Take(step.Unmount, target); err != nil {
		return fmt.Errorf("detaching %s: %w", target, err)
	}
	if err := m.detach(target); err != nil {
		return fmt.Errorf("detaching %s: %w", target, err)
	}
	return nil
}

// detachMount is umount2(target, MNT_DETACH), following no symlink at
// target itself.
func detachMount(target string) error {
	for {
		err := unix.Unmount(target, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		if err != unix.EINTR {
			return err
		}
	}
}

// bind makes target (a directory when dir, an empty file otherwise) and
// bind-mounts the file open as fd on it, then checks the mount.
func (m *Manager) bind(ctx context.Context, s Mount, fd int, dir bool, target string) error {
	if err := m.makeTarget(s.target(), dir); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// mount(8) is another process: it reaches the descriptor through this
	// process's /proc entry, and with --no-canonicalize hands the magic
	// link to mount(2) as it is, which binds the opened file itself.
	source := fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), fd)
	if _, err := m.mountPath(s.target()); err != nil {
		return err
	}
	before, err := m.fileAt(target)
	if err != nil {
		return err
	}
	if err := m.mounter.MountSensitiveWithoutSystemdWithMountFlags(source, target, "", []string{"bind"}, nil, []string{"--no-canonicalize"}); err != nil {
		return fmt.Errorf("bind-mounting %s at %s: %w", source, target, err)
	}
	want, err := fdFile(fd)
	if err != nil {
		return err
	}
	switch got, err := m.fileAt(target); {
	case err != nil:
		return err
	case got == want:
		return nil
	case got == before:
		return fmt.Errorf("%s: %w (a mounter that makes no mounts, a fake, must implement subpath.BindRecorder)", target, errNotMounted)
	default:
		return fmt.Errorf("%s: %w", target, errMismatch)
	}
}

// makeTarget creates the bind mount's target name (relative to the root)
// and its parents. A target of the other kind left by an earlier Prepare
// (the subPath was a file and is a directory now, or the reverse) is
// replaced when it is empty.
func (m *Manager) makeTarget(name string, dir bool) error {
	if err := m.root.MkdirAll(filepath.Dir(name), dirMode); err != nil {
		return err
	}
	fi, err := m.root.Lstat(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return err
	case fi.IsDir() == dir && (dir || fi.Mode().IsRegular()):
		return nil
	default:
		if err := m.removeTarget(name); err != nil {
			return err
		}
	}
	if dir {
		return m.root.MkdirAll(name, dirMode)
	}
	return m.root.Create(name, fileMode)
}

// removeTarget removes name if it is an empty directory or an empty
// regular file, what Prepare makes as a target; anything else stays and
// is an error.
func (m *Manager) removeTarget(name string) error {
	fi, err := m.root.Lstat(name)
	if err != nil {
		return err
	}
	if fi.Mode().IsRegular() && fi.Size() != 0 {
		full, _ := m.root.Join(name)
		return fmt.Errorf("%s: a file of %d bytes is not a subPath target: not removed", full, fi.Size())
	}
	return m.root.Remove(name)
}

// undo takes down what a failed Prepare of s left: the mount at target,
// the target, and the directories above it that it leaves empty.
func (m *Manager) undo(ctx context.Context, s Mount, target string) error {
	if err := m.cleanTarget(ctx, s.target()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return m.removeEmptyDirs(filepath.Join(volumeDir(s.Pod, s.Volume), s.Container), volumeDir(s.Pod, s.Volume), podSubPathsDir(s.Pod))
}

// removeEmptyDirs removes each of dirs (relative to the root) in turn
// while they are empty.
func (m *Manager) removeEmptyDirs(dirs ...string) error {
	for _, d := range dirs {
		err := m.root.Remove(d)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case errors.Is(err, syscall.ENOTEMPTY), errors.Is(err, syscall.EEXIST):
			return nil
		case err != nil:
			return err
		}
	}
	return nil
}

// fileID is a file's device and inode.
type fileID struct{ dev, ino uint64 }

// fdFile returns the file open as fd.
func fdFile(fd int) (fileID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fileID{}, fmt.Errorf("fstat of the opened subPath: %w", err)
	}
	return fileID{dev: st.Dev, ino: st.Ino}, nil
}

// isFile reports whether the file at target is the one open as fd.
func (m *Manager) isFile(fd int, target string) (bool, error) {
	want, err := fdFile(fd)
	if err != nil {
		return false, err
	}
	got, err := m.fileAt(target)
	return got == want, err
}

// statFile returns the file at target, reached without following a
// symlink: across a bind mount, the mounted file.
func (m *Manager) statFile(target string) (fileID, error) {
	fi, err := m.root.Lstat(target)
	if err != nil {
		return fileID{}, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, fmt.Errorf("%s: no stat_t", target)
	}
	return fileID{dev: st.Dev, ino: st.Ino}, nil
}
