package rootfs

import (
	"errors"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// The kernel's openat2, probed once; tests may turn it off.
var (
	openat2Once sync.Once
	openat2OK   bool
	noOpenat2   bool // tests: use the walk
)

// HaveOpenat2 reports whether the kernel's openat2 can resolve a path
// with RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS here (probed once): without it
// a path is walked a component at a time with O_NOFOLLOW.
func HaveOpenat2() bool {
	if noOpenat2 {
		return false
	}
	openat2Once.Do(func() {
		fd, err := unix.Openat2(unix.AT_FDCWD, ".", &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS,
		})
		if err == nil {
			_ = unix.Close(fd)
		}
		// ENOSYS: an older kernel; EPERM: a seccomp filter that does not know
		// it; E2BIG/EINVAL: it does not know the flags.
		openat2OK = err == nil
	})
	return openat2OK
}

// openRoot opens the root directory, or returns a held Root's handle:
// release what it returns with releaseRoot.
func (r *Root) openRoot(op, full string) (int, error) {
	if r.held {
		return r.fd, nil
	}
	fd, err := unix.Open(r.path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &PathError{Op: op, Path: full, Component: r.path, Err: err}
	}
	return fd, nil
}

// releaseRoot closes fd unless it is a held Root's handle, which stays
// open until Close.
func (r *Root) releaseRoot(fd int) {
	if r.held && fd == r.fd {
		return
	}
	_ = unix.Close(fd)
}

// open opens comps below the root with flags for the last component (the
// intermediate ones must be directories), following no symlink: a last
// component that is a symlink is opened itself (not followed) only with
// O_PATH|O_NOFOLLOW in flags, and is an error otherwise.
func (r *Root) open(op, full string, comps []string, flags int) (int, error) {
	rootFd, err := r.openRoot(op, full)
	if err != nil {
		return -1, err
	}
	defer r.releaseRoot(rootFd)
	return r.openFrom(rootFd, op, full, comps, flags)
}

func (r *Root) openFrom(rootFd int, op, full string, comps []string, flags int) (int, error) {
	flags |= unix.O_CLOEXEC
	if len(comps) == 0 {
		fd, err := unix.Openat(rootFd, ".", flags&^unix.O_NOFOLLOW, 0)
		if err != nil {
			return -1, &PathError{Op: op, Path: full, Component: r.path, Err: err}
		}
		return fd, nil
	}
	if HaveOpenat2() {
		how := &unix.OpenHow{Flags: uint64(flags), Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
		for range 8 {
			fd, err := unix.Openat2(rootFd, strings.Join(comps, "/"), how)
			if err == unix.EAGAIN || err == unix.EINTR {
				continue
			}
			if err == unix.ENOENT {
				// With RESOLVE_NO_SYMLINKS a symlink fails with ELOOP and a
				// file where a directory is needed with ENOTDIR, both before
				// the components after them are looked at: ENOENT means a
				// component is missing and nothing else. Not walking again to
				// name it keeps a missing path (the legacy staging path, a
				// record not written yet) as cheap as one failed openat2.
				return -1, &PathError{Op: op, Path: full, Err: err}
			}
			if err != nil {
				return -1, r.diagnose(rootFd, op, full, comps, flags, err)
			}
			return fd, nil
		}
	}
	return r.walk(rootFd, op, full, comps, flags)
}

// walk opens comps one at a time, each with O_NOFOLLOW from the directory
// opened before: no symlink is followed and nothing resolves above rootFd.
func (r *Root) walk(rootFd int, op, full string, comps []string, flags int) (int, error) {
	fd, err := unix.Dup(rootFd)
	if err != nil {
		return -1, &PathError{Op: op, Path: full, Err: err}
	}
	for i, c := range comps {
		f := unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
		if i == len(comps)-1 {
			f = flags | unix.O_NOFOLLOW
		}
		next, err := unix.Openat(fd, c, f, 0)
		if err != nil {
			perr := r.classify(fd, op, full, comps[:i+1], i == len(comps)-1, flags, err)
			_ = unix.Close(fd)
			return -1, perr
		}
		_ = unix.Close(fd)
		fd = next
	}
	return fd, nil
}

// diagnose turns openat2's error into one naming the component at fault,
// walking from rootFd to find it.
func (r *Root) diagnose(rootFd int, op, full string, comps []string, flags int, cause error) error {
	fd, err := unix.Dup(rootFd)
	if err != nil {
		return &PathError{Op: op, Path: full, Err: cause}
	}
	defer func() { _ = unix.Close(fd) }()
	for i, c := range comps {
		last := i == len(comps)-1
		if perr := r.classify(fd, op, full, comps[:i+1], last, flags, nil); perr != nil {
			return perr
		}
		if last {
			break
		}
		next, err := unix.Openat(fd, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			break
		}
		_ = unix.Close(fd)
		fd = next
	}
	return &PathError{Op: op, Path: full, Err: cause}
}

// classify explains why component prefix[len-1] in directory dirFd could
// not be opened (or, with cause nil, whether it can be): it is missing, a
// symlink, or not a directory where one is needed. It returns nil when it
// finds nothing wrong and cause is nil.
func (r *Root) classify(dirFd int, op, full string, prefix []string, last bool, flags int, cause error) error {
	comp := filepath.Join(r.path, strings.Join(prefix, "/"))
	var st unix.Stat_t
	if err := unix.Fstatat(dirFd, prefix[len(prefix)-1], &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &PathError{Op: op, Path: full, Component: comp, Err: err}
	}
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		if last && flags&unix.O_PATH != 0 && flags&unix.O_NOFOLLOW != 0 && cause == nil {
			return nil
		}
		return &PathError{Op: op, Path: full, Component: comp, Err: ErrSymlink}
	case st.Mode&unix.S_IFMT != unix.S_IFDIR && (!last || flags&unix.O_DIRECTORY != 0):
		return &PathError{Op: op, Path: full, Component: comp, Err: ErrNotDir}
	}
	if cause == nil {
		return nil
	}
	return &PathError{Op: op, Path: full, Component: comp, Err: cause}
}

// parent opens the directory that holds name's last component and returns
// it with that component; release it with releaseRoot (for a name of one
// component in a held Root it is the held handle). name must not be the
// root.
func (r *Root) parent(op, name string) (dirFd int, base, full string, err error) {
	comps, full, err := r.split(op, name)
	if err != nil {
		return -1, "", "", err
	}
	if len(comps) == 0 {
		return -1, "", "", &PathError{Op: op, Path: full, Err: errors.New("not allowed on the root itself")}
	}
	if len(comps) == 1 && r.held {
		// The held handle is the parent: nothing to open (release it
		// with releaseRoot, which keeps it).
		return r.fd, comps[0], full, nil
	}
	fd, err := r.open(op, full, comps[:len(comps)-1], unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return -1, "", "", err
	}
	return fd, comps[len(comps)-1], full, nil
}
