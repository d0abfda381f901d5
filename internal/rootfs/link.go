package rootfs

import (
	"errors"

	"golang.org/x/sys/unix"

	"github.com/nodevol/nodevol/step"
)

// Symlink creates name as a symlink to target (which is stored as it is,
// not resolved). name's directory must exist.
func (r *Root) Symlink(target, name string) error {
	return r.change("symlink", step.Symlink, name, func(dirFd int, base, full string) error {
		if err := unix.Symlinkat(target, dirFd, base); err != nil {
			return &PathError{Op: "symlink", Path: full, Component: full, Err: err}
		}
		return nil
	})
}

// Readlink returns the target of symlink name. Anything but a symlink is
// an error (EINVAL, as readlink(2) gives).
func (r *Root) Readlink(name string) (string, error) {
	dirFd, base, full, err := r.parent("readlink", name)
	if err != nil {
		return "", err
	}
	defer r.releaseRoot(dirFd)
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirFd, base, buf)
		if err != nil {
			return "", &PathError{Op: "readlink", Path: full, Component: full, Err: err}
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// RemoveLink removes name if it is a symlink (the link, never what it
// points to). Anything else is an error and stays. A missing name is an
// error for which errors.Is(err, fs.ErrNotExist) holds.
func (r *Root) RemoveLink(name string) error {
	return r.removeEntry(name, func(mode uint32) (int, error) {
		if mode != unix.S_IFLNK {
			return 0, errors.New("is not a symlink: not removed")
		}
		return 0, nil
	})
}
