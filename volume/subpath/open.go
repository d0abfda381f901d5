package subpath

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nodevol/nodevol/internal/rootfs"
	"github.com/nodevol/nodevol/util/step"
)

// componentError is the error for comps[:n] (a prefix of a subPath) below
// the volume's directory volumePath.
func componentError(volumePath string, comps []string, n int, err error) error {
	return fmt.Errorf("%s: %w", filepath.Join(volumePath, strings.Join(comps[:n], "/")), err)
}

// openBeneath opens comps below the directory dirFd (volumePath, for
// errors) with O_PATH, following no symlink and not leaving dirFd's
// tree. It returns the descriptor and the file's type (S_IFMT bits). A
// missing component is an error wrapping ENOENT, with missing its index;
// a symlink wraps ErrSymlink; a component that is not a directory where
// one is needed wraps ENOTDIR.
func openBeneath(dirFd int, volumePath string, comps []string) (fd int, mode uint32, missing int, err error) {
	if len(comps) == 0 {
		fd, err = unix.Openat(dirFd, ".", unix.O_PATH|unix.O_CLOEXEC, 0)
	} else if rootfs.HaveOpenat2() {
		how := &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		}
		for range 8 {
			fd, err = unix.Openat2(dirFd, strings.Join(comps, "/"), how)
			if err != unix.EAGAIN && err != unix.EINTR {
				break
			}
		}
		if err != nil {
			// The walk names the component at fault (and finds where a
			// path is missing); it is as safe, only slower.
			return walkBeneath(dirFd, volumePath, comps)
		}
	} else {
		return walkBeneath(dirFd, volumePath, comps)
	}
	if err != nil {
		return -1, 0, -1, fmt.Errorf("%s: %w", volumePath, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		_ = unix.Close(fd)
		return -1, 0, -1, componentError(volumePath, comps, len(comps), err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		// O_PATH|O_NOFOLLOW opens a symlink as the last component itself.
		_ = unix.Close(fd)
		return -1, 0, -1, componentError(volumePath, comps, len(comps), ErrSymlink)
	}
	return fd, st.Mode & unix.S_IFMT, -1, nil
}

// walkBeneath is openBeneath one component at a time, each opened with
// O_PATH|O_NOFOLLOW from the directory opened before and checked with
// fstat before it is used, as the kubelet does.
func walkBeneath(dirFd int, volumePath string, comps []string) (int, uint32, int, error) {
	fd, err := unix.Dup(dirFd)
	if err != nil {
		return -1, 0, -1, fmt.Errorf("%s: %w", volumePath, err)
	}
	for i, c := range comps {
		next, err := unix.Openat(fd, c, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		_ = unix.Close(fd)
		if err != nil {
			missing := -1
			if err == unix.ENOENT {
				missing = i
			}
			return -1, 0, missing, componentError(volumePath, comps, i+1, err)
		}
		fd = next
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			_ = unix.Close(fd)
			return -1, 0, -1, componentError(volumePath, comps, i+1, err)
		}
		switch t := st.Mode & unix.S_IFMT; {
		case t == unix.S_IFLNK:
			_ = unix.Close(fd)
			return -1, 0, -1, componentError(volumePath, comps, i+1, ErrSymlink)
		case i < len(comps)-1 && t != unix.S_IFDIR:
			_ = unix.Close(fd)
			return -1, 0, -1, componentError(volumePath, comps, i+1, unix.ENOTDIR)
		case i == len(comps)-1:
			return fd, t, -1, nil
		}
	}
	return -1, 0, -1, fmt.Errorf("%s: no component", volumePath)
}

// mkdirBeneath creates comps[missing:] below the directory dirFd, whose
// comps[:missing] exist, as directories of mode perm (permission, setgid,
// setuid and sticky bits; set with fchmod, so the umask does not cut
// them), as the kubelet creates a missing subPath. Each directory is
// opened right after it is made, without following a symlink, and the
// next made in it. A component that appears meanwhile ends the creation
// without error: the open that follows checks what is there.
func (m *Manager) mkdirBeneath(ctx context.Context, dirFd int, volumePath string, comps []string, missing int, perm uint32) error {
	fd, _, _, err := openBeneath(dirFd, volumePath, comps[:missing])
	if err != nil {
		return err
	}
	defer func() { _ = unix.Close(fd) }()
	for i := missing; i < len(comps); i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		full := filepath.Join(volumePath, strings.Join(comps[:i+1], "/"))
		if err := m.steps.Take(step.Mkdir, full); err != nil {
			return fmt.Errorf("%s: %w", full, err)
		}
		if err := unix.Mkdirat(fd, comps[i], perm&0o777); err != nil {
			if errors.Is(err, unix.EEXIST) {
				return nil
			}
			return fmt.Errorf("creating %s: %w", full, err)
		}
		next, err := unix.Openat(fd, comps[i], unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("opening %s: %w", full, err)
		}
		_ = unix.Close(fd)
		fd = next
		if err := unix.Fchmod(fd, perm); err != nil {
			return fmt.Errorf("chmod %s: %w", full, err)
		}
	}
	return nil
}
