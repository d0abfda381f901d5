package rootfs

import (
	"errors"
	"io/fs"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nodevol/nodevol/step"
)

// Remove removes name if it is a regular file or an empty directory. It
// follows no symlink: a symlink as name or above it is an error
// (ErrSymlink) and nothing is removed, and so is anything else that is not
// a regular file or a directory (ErrNotRemovable). Each call resolves name
// afresh from the root. A missing name is an error for which
// errors.Is(err, fs.ErrNotExist) holds.
func (r *Root) Remove(name string) error { return r.removeEntry(name, removable) }

// RemoveAny removes name whatever it is, except a directory that is not
// empty: a regular file or an empty directory as Remove does, and also a
// symlink (the link itself, never what it points to), a FIFO, a socket or
// a device node. It is for a name nodevol owns and takes back from
// whatever was put there; removing a directory entry never follows it.
// Like Remove it follows no symlink above name, and a missing name is an
// error for which errors.Is(err, fs.ErrNotExist) holds.
func (r *Root) RemoveAny(name string) error {
	return r.removeEntry(name, func(mode uint32) (int, error) {
		if mode == unix.S_IFDIR {
			return unix.AT_REMOVEDIR, nil
		}
		return 0, nil
	})
}

// Unlink is RemoveAny for a name expected to be there (a record about to
// be dropped): the entry is unlinked without a look at it first, and only
// a directory (EISDIR) is removed again as one; one system call fewer.
// The removal is shown to the hook before it is known whether the name is
// there.
func (r *Root) Unlink(name string) error {
	dirFd, base, full, err := r.parent("remove", name)
	if err != nil {
		return err
	}
	defer r.releaseRoot(dirFd)
	if err := r.take(step.Remove, full); err != nil {
		return err
	}
	// unlinkat never follows the last component.
	err = unix.Unlinkat(dirFd, base, 0)
	if err == unix.EISDIR {
		err = unix.Unlinkat(dirFd, base, unix.AT_REMOVEDIR)
	}
	if err != nil {
		return &PathError{Op: "remove", Path: full, Component: full, Err: err}
	}
	return nil
}

// removable is Remove's rule: an empty directory or a regular file goes; a
// symlink or anything else stays.
func removable(mode uint32) (int, error) {
	switch mode {
	case unix.S_IFDIR:
		return unix.AT_REMOVEDIR, nil
	case unix.S_IFREG:
		return 0, nil
	case unix.S_IFLNK:
		return 0, ErrSymlink
	}
	return 0, ErrNotRemovable
}

// removeEntry removes name's last component if allow, given its type
// (S_IFMT bits, not following a symlink), says how (unlinkat flags).
func (r *Root) removeEntry(name string, allow func(mode uint32) (int, error)) error {
	dirFd, base, full, err := r.parent("remove", name)
	if err != nil {
		return err
	}
	defer r.releaseRoot(dirFd)
	return r.removeAt(dirFd, base, full, allow)
}

// RemoveIn removes the entries names (base names) of directory dir, then
// dir itself, each only if it is a regular file or an empty directory, as
// Remove does; a missing entry or dir is skipped. dir is resolved once, from
// the root, following no symlink, and the entries are removed relative to
// that handle: one resolution for the whole directory rather than one per
// entry, which is most of a volume teardown's file-system work. A symlink as
// dir, above it or among names is an error (ErrSymlink) and nothing through
// it is removed; the first error stops the removals.
func (r *Root) RemoveIn(dir string, names ...string) error {
	parentFd, base, full, err := r.parent("remove", dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer r.releaseRoot(parentFd)
	dirFd, err := unix.Openat(parentFd, base, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	switch {
	case err == unix.ENOENT:
		return nil
	case err != nil:
		comps, _, _ := r.split("remove", dir)
		return r.classify(parentFd, "remove", full, comps, true, unix.O_DIRECTORY, err)
	}
	defer r.releaseRoot(dirFd)
	for _, name := range names {
		if strings.Contains(name, "/") || name == "" || name == "." || name == ".." {
			return &PathError{Op: "remove", Path: filepath.Join(full, name), Err: errors.New("not a base name")}
		}
		if err := r.removeAt(dirFd, name, filepath.Join(full, name), removable); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	if err := r.removeAt(parentFd, base, full, removable); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// removeAt removes entry name of dirFd if allow, given its type (S_IFMT
// bits, not following a symlink), says how (unlinkat flags); full names it
// in errors. Only a removal that allow permits is shown to the root's hook.
func (r *Root) removeAt(dirFd int, name, full string, allow func(mode uint32) (int, error)) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirFd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &PathError{Op: "remove", Path: full, Component: full, Err: err}
	}
	// unlinkat never follows the last component: were it swapped after the
	// check, the new entry itself would go (or the call fail), never what a
	// symlink points to.
	flags, err := allow(st.Mode & unix.S_IFMT)
	if err == nil {
		if err := r.take(step.Remove, full); err != nil {
			return err
		}
		err = unix.Unlinkat(dirFd, name, flags)
	}
	if err != nil {
		return &PathError{Op: "remove", Path: full, Component: full, Err: err}
	}
	return nil
}
