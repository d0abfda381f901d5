package rootfs

import "golang.org/x/sys/unix"

// MountRoot reports whether name (not followed if it is a symlink; no
// symlink above it followed either) is the root of a mount: a file system
// or a bind mount, of a directory or of a file, mounted there. The kernel
// says so from Linux 5.8 (statx's STATX_ATTR_MOUNT_ROOT); known is false
// where it does not, and the caller must ask the mount table instead.
func (r *Root) MountRoot(name string) (mountRoot, known bool, err error) {
	comps, full, err := r.split("statx", name)
	if err != nil {
		return false, false, err
	}
	var stx unix.Statx_t
	err = r.openBriefly("statx", full, comps, unix.O_PATH|unix.O_NOFOLLOW, func(fd int) error {
		if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BASIC_STATS, &stx); err != nil {
			return &PathError{Op: "statx", Path: full, Component: full, Err: err}
		}
		return nil
	})
	if err != nil {
		return false, false, err
	}
	if stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT == 0 {
		return false, false, nil
	}
	return stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0, true, nil
}
