package rootfs

import (
	"bytes"
	"errors"
	"io/fs"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nodevol/nodevol/step"
)

// RewriteFile is a regular file below the root that one operation writes
// more than once (a record of work in flight, written before a call and
// again after it), opened once by OpenRewrite: each later write is one
// system call on the descriptor, where WriteFileInPlace resolves the name,
// opens, checks, writes, cuts and closes every time. Not safe for
// concurrent use; Close it when the operation ends.
type RewriteFile struct {
	r    *Root
	fd   int
	full string
	size int  // the length of what the file holds
	pad  byte // what fills the rest of a longer content
}

// OpenRewrite shows a write of name to the root's hook, then opens name
// for writing, creating it with perm when it is missing, and writes data
// over its content, as WriteFileInPlace does, except that a longer content
// is not cut: what data leaves of it is filled with pad (a JSON file
// padded with spaces reads as data alone), which spares a write that
// comes after a longer one the ftruncate. name's directory must exist. No
// symlink is followed below the root, name's own included: a symlink there
// is an error wrapping ErrSymlink, anything but a regular file one
// wrapping ErrNotRemovable, and nothing is written. fresh says the caller
// expects no file there: it is created with O_EXCL, and so known to be a
// new, empty regular file without an fstat (one that is there after all
// is opened as when fresh is false). As with WriteFileInPlace, a crash
// between a write and its end, or a reader racing it, can see a mix of the
// old and the new content: use it where a mix is detected (a JSON decoder
// refuses it) and harmless.
func (r *Root) OpenRewrite(name string, data []byte, perm fs.FileMode, fresh bool, pad byte) (*RewriteFile, error) {
	comps, full, err := r.split("write", name)
	if err != nil {
		return nil, err
	}
	if len(comps) == 0 {
		return nil, &PathError{Op: "write", Path: full, Err: errors.New("not allowed on the root itself")}
	}
	if err := r.take(step.Write, full); err != nil {
		return nil, err
	}
	const flags = unix.O_WRONLY | unix.O_CREAT | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC
	f := &RewriteFile{r: r, fd: -1, full: full, pad: pad}
	if fresh {
		f.fd, err = r.openCreate(comps, flags|unix.O_EXCL, perm)
		if err == unix.EEXIST {
			fresh = false
		}
	}
	if !fresh {
		f.fd, err = r.openCreate(comps, flags, perm)
	}
	var pe *PathError
	switch {
	case errors.As(err, &pe):
		return nil, err
	case err == unix.ELOOP:
		return nil, &PathError{Op: "write", Path: full, Component: full, Err: ErrSymlink}
	case err != nil:
		return nil, &PathError{Op: "write", Path: full, Component: full, Err: err}
	}
	if !fresh {
		var st unix.Stat_t
		if err := unix.Fstat(f.fd, &st); err != nil {
			_ = unix.Close(f.fd)
			return nil, &PathError{Op: "write", Path: full, Err: err}
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			_ = unix.Close(f.fd)
			return nil, &PathError{Op: "write", Path: full, Component: full, Err: ErrNotRemovable}
		}
		f.size = int(st.Size)
	}
	if err := f.write(data); err != nil {
		_ = unix.Close(f.fd)
		return nil, err
	}
	return f, nil
}

// openCreate opens comps below the root with flags (O_CREAT among them)
// and perm for a file it creates, following no symlink: one openat2 from
// the root, or without it the last component opened (with O_NOFOLLOW)
// from its directory, reached by the walk. It returns the system error
// itself.
func (r *Root) openCreate(comps []string, flags int, perm fs.FileMode) (int, error) {
	rootFd, err := r.openRoot("write", r.path)
	if err != nil {
		return -1, err
	}
	defer r.releaseRoot(rootFd)
	if HaveOpenat2() {
		how := &unix.OpenHow{Flags: uint64(flags), Mode: uint64(perm.Perm()),
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
		for {
			fd, err := unix.Openat2(rootFd, strings.Join(comps, "/"), how)
			switch err {
			case unix.EAGAIN, unix.EINTR:
				continue
			case unix.ELOOP, unix.ENOTDIR:
				// Name the component at fault, as every other call does.
				return -1, r.diagnose(rootFd, "write", filepath.Join(r.path, strings.Join(comps, "/")), comps, flags&^unix.O_CREAT, err)
			}
			return fd, err
		}
	}
	dirFd := rootFd
	if len(comps) > 1 {
		dirFd, err = r.walk(rootFd, "write", r.path, comps[:len(comps)-1], unix.O_PATH|unix.O_DIRECTORY)
		if err != nil {
			return -1, err
		}
		defer unix.Close(dirFd)
	}
	return unix.Openat(dirFd, comps[len(comps)-1], flags, uint32(perm.Perm()))
}

// Rewrite shows a write of the file to the root's hook, then writes data
// over its content on the held descriptor, filling what data leaves of a
// longer content with the pad byte (OpenRewrite). One system call.
func (f *RewriteFile) Rewrite(data []byte) error {
	if err := f.r.take(step.Write, f.full); err != nil {
		return err
	}
	return f.write(data)
}

func (f *RewriteFile) write(data []byte) error {
	if len(data) < f.size {
		data = append(data, bytes.Repeat([]byte{f.pad}, f.size-len(data))...)
	}
	for off := 0; off < len(data); {
		n, err := unix.Pwrite(f.fd, data[off:], int64(off))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return &PathError{Op: "write", Path: f.full, Err: err}
		}
		off += n
	}
	f.size = len(data)
	return nil
}

// Close closes the file's descriptor.
func (f *RewriteFile) Close() error {
	if f.fd < 0 {
		return nil
	}
	err := unix.Close(f.fd)
	f.fd = -1
	return err
}
