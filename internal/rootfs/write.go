package rootfs

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nodevol/nodevol/step"
)

// MkdirAll creates directory name and the missing directories above it
// (the root too) with perm (before umask), as os.MkdirAll does, except that
// every component below the root that exists must be a directory and not a
// symlink: a symlink fails it (ErrSymlink), before anything is created
// through it.
func (r *Root) MkdirAll(name string, perm fs.FileMode) error {
	comps, full, err := r.split("mkdir", name)
	if err != nil {
		return err
	}
	fd, err := r.openRoot("mkdir", full)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(r.path, perm); err != nil {
			return &PathError{Op: "mkdir", Path: full, Component: r.path, Err: err}
		}
		fd, err = r.openRoot("mkdir", full)
	}
	if err != nil {
		return err
	}
	defer func() { r.releaseRoot(fd) }()
	// Find the deepest directory that exists, from the whole path up (the
	// common case: all of it, or all but the last few components), one
	// openat2 each; then create the rest below it. Without openat2, or on
	// anything but a missing component, walk from the root, which names
	// the component at fault.
	start, missing := 0, false
	if HaveOpenat2() {
		for i := len(comps); i > 0; i-- {
			next, err := r.openFrom(fd, "mkdir", full, comps[:i], unix.O_PATH|unix.O_DIRECTORY)
			if err == nil {
				if i == len(comps) {
					_ = unix.Close(next)
					return nil
				}
				r.releaseRoot(fd)
				fd, start = next, i
				break
			}
			if !errors.Is(err, fs.ErrNotExist) {
				missing = false
				break
			}
			// comps[:i-1] may exist; comps[i-1] is missing if it does.
			missing = true
		}
	}
	_, err = r.mkdirFrom(&fd, comps, start, missing, false, full, perm)
	return err
}

// mkdirFrom makes comps[start:] below *fd, the directory comps[:start]
// (the root when start is 0), one component at a time, each opened with
// O_NOFOLLOW from the one before: an existing component is checked, a
// missing one made. missing says comps[start] is known to be missing: it is
// made without looking first, and so is every component below one just
// made. *fd ends as the last directory opened; the caller releases it.
// With keep the last directory is opened even when just made (the caller
// works in it); without it a last directory just made is not opened and
// *fd stays its parent. It reports whether it made the last directory.
func (r *Root) mkdirFrom(fd *int, comps []string, start int, missing, keep bool, full string, perm fs.FileMode) (bool, error) {
	const dirFlags = unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	made := false
	for i := start; i < len(comps); i++ {
		c, last := comps[i], i == len(comps)-1
		compPath := filepath.Join(r.path, strings.Join(comps[:i+1], "/"))
		next, err := -1, error(unix.ENOENT)
		if !missing {
			next, err = unix.Openat(*fd, c, dirFlags, 0)
		}
		missing, made = false, false
		if err == unix.ENOENT {
			if err := r.take(step.Mkdir, compPath); err != nil {
				return false, err
			}
			err = unix.Mkdirat(*fd, c, uint32(perm.Perm()))
			made = err == nil
			if made && last && !keep {
				return true, nil // just made: a directory, nothing below it to reach
			}
			missing = made // so is what goes below it
			if err != nil && err != unix.EEXIST {
				return false, &PathError{Op: "mkdir", Path: full, Component: compPath, Err: err}
			}
			next, err = unix.Openat(*fd, c, dirFlags, 0)
		}
		if err != nil {
			return false, r.classify(*fd, "mkdir", full, comps[:i+1], false, 0, err)
		}
		r.releaseRoot(*fd)
		*fd = next
	}
	return made, nil
}

// Create creates name as an empty regular file with perm (before umask).
// It fails if anything, a symlink included, is there already
// (errors.Is(err, fs.ErrExist)).
func (r *Root) Create(name string, perm fs.FileMode) error {
	return r.change("create", step.Create, name, func(dirFd int, base, full string) error {
		fd, err := unix.Openat(dirFd, base, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(perm.Perm()))
		if err != nil {
			return &PathError{Op: "create", Path: full, Component: full, Err: err}
		}
		return unix.Close(fd)
	})
}

// WriteFileInPlace writes data over name's content (creating it with
// perm if it is not there) and cuts it to len(data). It is not atomic: a
// reader racing the writer, or a crash between the write and the cut,
// can see a mix of the old and the new content. Use it where such a mix
// is detected (a JSON decoder refuses it) and harmless, and where
// WriteFileAtomic's rename over an existing file is too slow: ext4 (with
// its default auto_da_alloc) starts writing a file back to disk when it
// replaces another by rename. A symlink as name is refused, as is
// anything but a regular file.
func (r *Root) WriteFileInPlace(name string, data []byte, perm fs.FileMode) error {
	return r.change("write", step.Write, name, func(dirFd int, base, full string) error {
		fd, err := unix.Openat(dirFd, base, unix.O_CREAT|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, uint32(perm.Perm()))
		if err != nil {
			if errors.Is(err, unix.ELOOP) {
				err = ErrSymlink
			}
			return &PathError{Op: "write", Path: full, Component: full, Err: err}
		}
		defer unix.Close(fd)
		return writeRegular(fd, full, data)
	})
}

// writeRegular writes data over the content of regular file fd, named
// full in errors, and cuts it to len(data).
func writeRegular(fd int, full string, data []byte) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &PathError{Op: "write", Path: full, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return &PathError{Op: "write", Path: full, Component: full, Err: ErrNotRemovable}
	}
	for off := 0; off < len(data); {
		n, err := unix.Pwrite(fd, data[off:], int64(off))
		if err != nil {
			return &PathError{Op: "write", Path: full, Err: err}
		}
		off += n
	}
	if err := unix.Ftruncate(fd, int64(len(data))); err != nil {
		return &PathError{Op: "write", Path: full, Err: err}
	}
	return nil
}

// writeAll writes data to fd, from its current offset.
func writeAll(fd int, data []byte) error {
	for len(data) > 0 {
		n, err := unix.Write(fd, data)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

// WriteFileAtomic writes data to name so that a reader sees the old
// content or the whole new content: it writes a temporary file in the same
// directory and renames it over name (replacing a symlink there, never
// writing through it). name's directory must exist. It does not fsync.
func (r *Root) WriteFileAtomic(name string, data []byte, perm fs.FileMode) error {
	return r.writeFileAtomic(name, data, perm, false)
}

// WriteFileAtomicSync is WriteFileAtomic made durable: the file is
// fsync'ed before the rename and its directory after, so that after a
// crash or power loss name holds the old or the new content, and a
// rename that returned is not undone.
func (r *Root) WriteFileAtomicSync(name string, data []byte, perm fs.FileMode) error {
	return r.writeFileAtomic(name, data, perm, true)
}

func (r *Root) writeFileAtomic(name string, data []byte, perm fs.FileMode, sync bool) (err error) {
	dirFd, base, full, err := r.parent("write", name)
	if err != nil {
		return err
	}
	defer r.releaseRoot(dirFd)
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	tmp := "." + base + ".tmp-" + hex.EncodeToString(rnd[:])
	if r.steps != nil {
		if err := r.take(step.Write, filepath.Join(filepath.Dir(full), tmp)); err != nil {
			return err
		}
	}
	fd, err := unix.Openat(dirFd, tmp, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(perm.Perm()))
	if err != nil {
		return &PathError{Op: "write", Path: full, Err: err}
	}
	// The raw descriptor, not an os.File, whose creation costs a system
	// call (fcntl) on every vol_data.json written.
	fdOpen := true
	defer func() {
		if err != nil {
			if fdOpen {
				_ = unix.Close(fd)
			}
			// The clean-up is a change too: after a refused step (a
			// crash, to the crash-point suite) the temporary file stays.
			if r.take(step.Remove, filepath.Join(filepath.Dir(full), tmp)) == nil {
				_ = unix.Unlinkat(dirFd, tmp, 0)
			}
		}
	}()
	if err = writeAll(fd, data); err != nil {
		return &PathError{Op: "write", Path: full, Err: err}
	}
	if err = unix.Fchmod(fd, uint32(perm.Perm())); err != nil {
		return &PathError{Op: "write", Path: full, Err: err}
	}
	if sync {
		if err = unix.Fsync(fd); err != nil {
			return &PathError{Op: "write", Path: full, Err: err}
		}
	}
	fdOpen = false
	if err = unix.Close(fd); err != nil {
		return &PathError{Op: "write", Path: full, Err: err}
	}
	if err = r.take(step.Rename, full); err != nil {
		return err
	}
	if err = unix.Renameat(dirFd, tmp, dirFd, base); err != nil {
		return &PathError{Op: "write", Path: full, Err: err}
	}
	if sync {
		// dirFd may be an O_PATH descriptor, which cannot be synced.
		d, err := unix.Openat(dirFd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err == nil {
			err = unix.Fsync(d)
			unix.Close(d)
		}
		if err != nil {
			return &PathError{Op: "write", Path: full, Err: err}
		}
	}
	return nil
}
