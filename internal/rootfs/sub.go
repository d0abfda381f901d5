package rootfs

import (
	"errors"
	"io/fs"

	"golang.org/x/sys/unix"

	"github.com/nodevol/nodevol/step"
)

// Sub opens directory name below the root, following no symlink, and
// returns a held Root on it (with the same steps hook): names given to it
// are relative to name (or absolute under it), and each name of one
// component costs only the system call that does the work, resolved from
// the held handle. For an operation that works in one directory (the
// atomic writer in a volume's directory). Close it when done; it does not
// see a file system mounted on name later.
func (r *Root) Sub(name string) (*Root, error) {
	comps, full, err := r.split("open", name)
	if err != nil {
		return nil, err
	}
	fd, err := r.open("open", full, comps, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return nil, err
	}
	return &Root{path: full, steps: r.steps, fd: fd, held: true}, nil
}

// Mkdir makes directory name with perm (before umask); its parent must
// exist. Anything already there is an error (errors.Is(err,
// fs.ErrExist)), a symlink included: nothing is followed.
func (r *Root) Mkdir(name string, perm fs.FileMode) error {
	return r.change("mkdir", step.Mkdir, name, func(dirFd int, base, full string) error {
		if err := unix.Mkdirat(dirFd, base, uint32(perm.Perm())); err != nil {
			return &PathError{Op: "mkdir", Path: full, Component: full, Err: err}
		}
		return nil
	})
}

// WriteFileNew creates name, which must not be there (errors.Is(err,
// fs.ErrExist) otherwise, a symlink included), writes data to it and
// gives it owner uid and group gid (-1: unchanged) and then mode perm,
// whatever the umask, all on the descriptor it created: the file it
// writes is the file it made. Not atomic: for a file no reader looks at
// yet (one of a version the atomic writer has not published).
func (r *Root) WriteFileNew(name string, data []byte, perm fs.FileMode, uid, gid int) error {
	return r.change("write", step.Write, name, func(dirFd int, base, full string) error {
		fd, err := unix.Openat(dirFd, base, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(perm.Perm()))
		if err != nil {
			return &PathError{Op: "write", Path: full, Component: full, Err: err}
		}
		err = writeAll(fd, data)
		if err == nil {
			err = setMode(fd, perm, uid, gid)
		}
		if cerr := unix.Close(fd); err == nil {
			err = cerr
		}
		if err != nil {
			return &PathError{Op: "write", Path: full, Err: err}
		}
		return nil
	})
}

// SetMode gives name (a regular file or a directory; "." for the Root's
// own directory) owner uid and group gid (-1: unchanged) and then mode,
// whatever the umask, on a descriptor opened without following a
// symlink. It is not a step: for what no reader sees yet, or for a
// directory just made.
func (r *Root) SetMode(name string, mode fs.FileMode, uid, gid int) error {
	comps, full, err := r.split("chmod", name)
	if err != nil {
		return err
	}
	fd, err := r.open("chmod", full, comps, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := setMode(fd, mode, uid, gid); err != nil {
		return &PathError{Op: "chmod", Path: full, Err: err}
	}
	return nil
}

// setMode gives fd owner uid and group gid (-1: unchanged), then mode:
// chown first, as it clears the setgid bit.
func setMode(fd int, mode fs.FileMode, uid, gid int) error {
	if uid != -1 || gid != -1 {
		if err := unix.Fchown(fd, uid, gid); err != nil {
			return err
		}
	}
	return unix.Fchmod(fd, fileModeBits(mode))
}

// fileModeBits are the chmod(2) bits of mode: permissions, setuid,
// setgid, sticky.
func fileModeBits(mode fs.FileMode) uint32 {
	m := uint32(mode.Perm())
	if mode&fs.ModeSetuid != 0 {
		m |= unix.S_ISUID
	}
	if mode&fs.ModeSetgid != 0 {
		m |= unix.S_ISGID
	}
	if mode&fs.ModeSticky != 0 {
		m |= unix.S_ISVTX
	}
	return m
}

// Lchown gives name owner uid and group gid (-1: unchanged), not
// following it if it is a symlink (the link itself changes). It is not a
// step, as SetMode.
func (r *Root) Lchown(name string, uid, gid int) error {
	dirFd, base, full, err := r.parent("lchown", name)
	if err != nil {
		return err
	}
	defer r.releaseRoot(dirFd)
	if err := unix.Fchownat(dirFd, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &PathError{Op: "lchown", Path: full, Component: full, Err: err}
	}
	return nil
}

// Rename renames oldName to newName (both under the root, on one file
// system), replacing what newName is (a symlink is replaced, never followed);
// shown to the hook as a rename of newName.
func (r *Root) Rename(oldName, newName string) error {
	dirFd, oldBase, _, err := r.parent("rename", oldName)
	if err != nil {
		return err
	}
	defer r.releaseRoot(dirFd)
	newDir, newBase, full, err := r.parent("rename", newName)
	if err != nil {
		return err
	}
	defer r.releaseRoot(newDir)
	if err := r.take(step.Rename, full); err != nil {
		return err
	}
	if err := unix.Renameat(dirFd, oldBase, newDir, newBase); err != nil {
		return &PathError{Op: "rename", Path: full, Err: err}
	}
	return nil
}

// OpenDirFd is OpenDir's raw descriptor (O_RDONLY|O_DIRECTORY), without
// the system call an os.File costs; the caller closes it.
func (r *Root) OpenDirFd(name string) (int, error) {
	comps, full, err := r.split("open", name)
	if err != nil {
		return -1, err
	}
	return r.open("open", full, comps, unix.O_RDONLY|unix.O_DIRECTORY)
}

// MkdirAllSub is MkdirAll returning the directory name as a held Root
// (Sub), and whether it made name's last component: a directory just
// made holds nothing its caller did not put there. known is how many of
// name's leading components are expected to exist (the directory the
// kubelet's layout puts volumes in): they are opened with one openat2,
// and the rest below them made or checked one component at a time, each
// opened with O_NOFOLLOW from the one before, the last one kept open. When
// those are missing it is MkdirAll and then Sub, and made is false (the
// caller then looks at what the directory holds).
func (r *Root) MkdirAllSub(name string, perm fs.FileMode, known int) (sub *Root, made bool, err error) {
	comps, full, err := r.split("mkdir", name)
	if err != nil {
		return nil, false, err
	}
	fd := -1
	if known > 0 && known < len(comps) {
		fd, err = r.open("mkdir", full, comps[:known], unix.O_PATH|unix.O_DIRECTORY)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, false, err
		}
	}
	if fd < 0 {
		if err := r.MkdirAll(name, perm); err != nil {
			return nil, false, err
		}
		sub, err := r.Sub(name)
		return sub, false, err
	}
	made, err = r.mkdirFrom(&fd, comps, known, false, true, full, perm)
	if err != nil {
		_ = unix.Close(fd)
		return nil, false, err
	}
	return &Root{path: full, steps: r.steps, fd: fd, held: true}, made, nil
}
