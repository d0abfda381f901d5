package rootfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Verify checks that no component of name below the root is a symlink,
// name's last component included, and that every existing component but
// the last is a directory. Missing components are not an error (a driver
// creates its target path; nothing can be below a missing directory). It
// returns name's absolute path, to hand to a driver or a mounter right
// away: see the package documentation for what a path string still allows.
func (r *Root) Verify(name string) (string, error) {
	comps, full, err := r.split("verify", name)
	if err != nil {
		return "", err
	}
	if len(comps) == 1 && r.held {
		// A name in the held directory (a Sub's leaf): one fstatat, not
		// following it, says all.
		var st unix.Stat_t
		switch err := unix.Fstatat(r.fd, comps[0], &st, unix.AT_SYMLINK_NOFOLLOW); {
		case err == unix.ENOENT:
			return full, nil
		case err != nil:
			return "", &PathError{Op: "verify", Path: full, Component: full, Err: err}
		case st.Mode&unix.S_IFMT == unix.S_IFLNK:
			return "", &PathError{Op: "verify", Path: full, Component: full, Err: ErrSymlink}
		}
		return full, nil
	}
	// With openat2 a symlink as the last component fails the open itself
	// (RESOLVE_NO_SYMLINKS without O_NOFOLLOW), so nothing needs to be
	// asked of the file; the walk opens such a symlink itself (O_PATH with
	// O_NOFOLLOW), and it is told by its type.
	flags, check := unix.O_PATH|unix.O_NOFOLLOW, true
	if HaveOpenat2() {
		flags, check = unix.O_PATH, false
	}
	var st syscall.Stat_t
	err = r.openBriefly("verify", full, comps, flags, func(fd int) error {
		if !check {
			return nil
		}
		if err := syscall.Fstat(fd, &st); err != nil {
			return &PathError{Op: "verify", Path: full, Err: err}
		}
		return nil
	})
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return full, nil
	case err != nil:
		return "", err
	case check && st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return "", &PathError{Op: "verify", Path: full, Component: full, Err: ErrSymlink}
	}
	return full, nil
}

// Lstat returns the FileInfo of name without following any symlink: a
// last component that is a symlink is described itself; a symlink above it
// is an error (ErrSymlink).
func (r *Root) Lstat(name string) (fs.FileInfo, error) {
	return r.stat("lstat", name, true)
}

// Stat is Lstat, except that a last component that is a symlink is an
// error too (ErrSymlink).
func (r *Root) Stat(name string) (fs.FileInfo, error) {
	return r.stat("stat", name, false)
}

func (r *Root) stat(op, name string, linkOK bool) (fs.FileInfo, error) {
	comps, full, err := r.split(op, name)
	if err != nil {
		return nil, err
	}
	fi := &fileInfo{name: filepath.Base(full)}
	err = r.openBriefly(op, full, comps, unix.O_PATH|unix.O_NOFOLLOW, func(fd int) error {
		if err := syscall.Fstat(fd, &fi.st); err != nil {
			return &PathError{Op: op, Path: full, Err: err}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if !linkOK && fi.Mode()&fs.ModeSymlink != 0 {
		return nil, &PathError{Op: op, Path: full, Component: full, Err: ErrSymlink}
	}
	return fi, nil
}

// ReadDir lists directory name, sorted by name, as os.ReadDir does. Its
// entries are not followed: a symlink in it is listed as a symlink.
func (r *Root) ReadDir(name string) ([]fs.DirEntry, error) {
	comps, full, err := r.split("readdir", name)
	if err != nil {
		return nil, err
	}
	fd, err := r.open("readdir", full, comps, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), full)
	defer f.Close()
	entries, err := f.ReadDir(-1)
	slices.SortFunc(entries, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	if err != nil {
		return entries, &PathError{Op: "readdir", Path: full, Err: err}
	}
	return entries, nil
}

// OpenDir opens directory name for reading (its entries, and as a
// directory to resolve further names from with the *at system calls). A
// symlink, the last component included, is an error.
func (r *Root) OpenDir(name string) (*os.File, error) {
	comps, full, err := r.split("open", name)
	if err != nil {
		return nil, err
	}
	fd, err := r.open("open", full, comps, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), full), nil
}

// Open opens regular file name for reading. A symlink (last component
// included) or anything but a regular file is an error; a FIFO does not
// block it.
func (r *Root) Open(name string) (*os.File, error) {
	comps, full, err := r.split("open", name)
	if err != nil {
		return nil, err
	}
	fd, err := r.open("open", full, comps, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), full)
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("is not a regular file (%v)", fi.Mode().Type())
	}
	if err != nil {
		f.Close()
		return nil, &PathError{Op: "open", Path: full, Component: full, Err: err}
	}
	return f, nil
}

// openBriefly opens full (comps below the root) with flags, hands the
// descriptor to fn and closes it, holding syscall.ForkLock for reading throughout, so
// that no process forked meanwhile by another goroutine (a mount or umount
// command) starts with a copy of the descriptor. Such a copy, kept until
// the child calls exec, would pin the mount the file is on: an unmount of
// it at that moment, as one right after a Verify, fails with "target is
// busy". Only for a file open a short time: forks wait for it.
func (r *Root) openBriefly(op, full string, comps []string, flags int, fn func(fd int) error) error {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	fd, err := r.open(op, full, comps, flags)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	whileOpen()
	return fn(fd)
}

// fileInfo is the fs.FileInfo of Lstat and Stat, made from the file's
// stat_t as os.File.Stat makes it, without an os.File (whose creation
// costs a system call).
type fileInfo struct {
	name string
	st   syscall.Stat_t
}

func (fi *fileInfo) Name() string       { return fi.name }
func (fi *fileInfo) Size() int64        { return fi.st.Size }
func (fi *fileInfo) ModTime() time.Time { return time.Unix(fi.st.Mtim.Unix()) }
func (fi *fileInfo) IsDir() bool        { return fi.Mode().IsDir() }
func (fi *fileInfo) Sys() any           { return &fi.st }

func (fi *fileInfo) Mode() fs.FileMode {
	m := fs.FileMode(fi.st.Mode & 0o777)
	switch fi.st.Mode & syscall.S_IFMT {
	case syscall.S_IFBLK:
		m |= fs.ModeDevice
	case syscall.S_IFCHR:
		m |= fs.ModeDevice | fs.ModeCharDevice
	case syscall.S_IFDIR:
		m |= fs.ModeDir
	case syscall.S_IFIFO:
		m |= fs.ModeNamedPipe
	case syscall.S_IFLNK:
		m |= fs.ModeSymlink
	case syscall.S_IFSOCK:
		m |= fs.ModeSocket
	}
	if fi.st.Mode&syscall.S_ISGID != 0 {
		m |= fs.ModeSetgid
	}
	if fi.st.Mode&syscall.S_ISUID != 0 {
		m |= fs.ModeSetuid
	}
	if fi.st.Mode&syscall.S_ISVTX != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// whileOpen is called by openBriefly while its file is open; tests set it.
var whileOpen = func() {}
