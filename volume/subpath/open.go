package subpath

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nodevol/nodevol/internal/rootfs"
	"github.com/nodevol/nodevol/step"
)

// openBeneath opens comps (a validated subPath's components) below the
// directory dirFd (volumePath, for errors) with O_PATH, resolving the
// symlinks that stay in the volume and never leaving it (walker). When
// the subPath's own last components are missing, the walked it returns
// is the deepest directory that exists, with missing set. A symlink that
// leads out of the volume wraps errEscape, a loop unix.ELOOP, a symlink
// whose target is missing fs.ErrNotExist, each with ErrSymlink; a
// component that is not a directory where one is needed wraps ENOTDIR.
func openBeneath(dirFd int, volumePath string, comps []string, afterLink func(string)) (walked, error) {
	if len(comps) > 0 && rootfs.HaveOpenat2() {
		// The common case, a subPath with no symlink, in one call; the
		// walk resolves symlinks and finds where a path is missing.
		how := &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		}
		name := strings.Join(comps, "/")
		for range 8 {
			fd, err := unix.Openat2(dirFd, name, how)
			if err == unix.EAGAIN || err == unix.EINTR {
				continue
			}
			if err != nil {
				break
			}
			var st unix.Stat_t
			if err := unix.Fstat(fd, &st); err != nil {
				_ = unix.Close(fd)
				return walked{}, fmt.Errorf("%s: %w", filepath.Join(volumePath, name), err)
			}
			if st.Mode&unix.S_IFMT != unix.S_IFLNK {
				return walked{fd: fd, mode: st.Mode & unix.S_IFMT, path: filepath.Join(volumePath, name)}, nil
			}
			// O_PATH|O_NOFOLLOW opens a symlink as the last component
			// itself: the walk follows it.
			_ = unix.Close(fd)
			break
		}
	}
	w, err := newWalker(dirFd, volumePath, afterLink)
	if err != nil {
		return walked{}, err
	}
	defer w.close()
	return w.walk(comps)
}

// mkdirBeneath creates names below the directory at (which openBeneath
// walked to) as directories of mode perm (permission, setgid, setuid and
// sticky bits; set with fchmod, so the umask does not cut them), as the
// kubelet creates a missing subPath. Each directory is opened right after
// it is made, without following a symlink, and the next made in it. A
// component that appears meanwhile ends the creation without error: the
// open that follows checks what is there.
func (m *Manager) mkdirBeneath(ctx context.Context, at walked, perm uint32) error {
	fd, err := unix.Dup(at.fd)
	if err != nil {
		return fmt.Errorf("%s: %w", at.path, err)
	}
	defer func() { _ = unix.Close(fd) }()
	full := at.path
	for _, name := range at.missing {
		if err := ctx.Err(); err != nil {
			return err
		}
		full = filepath.Join(full, name)
		if err := m.steps.Take(step.Mkdir, full); err != nil {
			return fmt.Errorf("%s: %w", full, err)
		}
		if err := unix.Mkdirat(fd, name, perm&0o777); err != nil {
			if errors.Is(err, unix.EEXIST) {
				return nil
			}
			return fmt.Errorf("creating %s: %w", full, err)
		}
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
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
