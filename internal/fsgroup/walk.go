// Package fsgroup gives a pod's fsGroup ownership of a volume's files, as
// the kubelet does, without following a symlink the pod may plant.
package fsgroup

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"k8s.io/klog/v2"
)

// Permission bits a pod's fsGroup gets on a volume's files, the kubelet's.
const (
	groupRW   fs.FileMode = 0o660
	groupExec fs.FileMode = 0o110
)

// Set gives group gid ownership of everything under dir, with group
// read-write permission and setgid on directories (the caller gives only
// writable volumes). Children come before their directory, so that the root is
// changed last: with onRootMismatch a root that already has the right
// group and permissions means a finished earlier walk, and nothing is
// done. Symbolic links get their group but no chmod (it would change their
// targets). As in the kubelet, a file whose group or mode cannot be changed
// is logged, not fatal; an unreadable directory is an error.
//
// dir itself must not be a symlink. Below it nothing is reached by path:
// each entry is opened without following it (O_PATH|O_NOFOLLOW) from its
// directory's descriptor, and changed through that descriptor, so that a
// pod swapping a directory or a file of its volume for a symlink while the
// walk runs cannot make it change anything outside the volume.
func Set(ctx context.Context, dir string, gid int64, onRootMismatch bool) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	d := os.NewFile(uintptr(fd), dir)
	defer d.Close()
	return setIn(ctx, d, gid, onRootMismatch, nil)
}

// setIn is Set of the open directory d that calls each (if not nil)
// before it changes each file, for progress reports.
func setIn(ctx context.Context, d *os.File, gid int64, onRootMismatch bool, each func(path string)) error {
	if onRootMismatch && rootHasOwnership(d, gid) {
		return nil
	}
	logger := klog.FromContext(ctx)
	return walkChildrenFirst(ctx, d, func(path string, fd int, info fs.FileInfo) {
		if each != nil {
			each(path)
		}
		if err := unix.Fchownat(fd, "", -1, int(gid), unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
			logger.Error(err, "Changing the group of a volume file failed", "path", path, "fsGroup", gid)
		}
		if info.Mode()&fs.ModeSymlink != 0 {
			return
		}
		mask := groupRW
		if info.IsDir() {
			mask |= fs.ModeSetgid | groupExec
		}
		// fchmod does not take an O_PATH descriptor; its /proc link reaches
		// the very file the descriptor holds, whatever its path became.
		if err := os.Chmod(procFd(fd), info.Mode()|mask); err != nil {
			logger.Error(err, "Changing the mode of a volume file failed", "path", path, "fsGroup", gid)
		}
	})
}

func procFd(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// rootHasOwnership reports whether directory d already has group gid, the
// group permissions and setgid.
func rootHasOwnership(d *os.File, gid int64) bool {
	info, err := d.Stat()
	if err != nil || !info.IsDir() {
		return false
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok || int64(st.Gid) != gid {
		return false
	}
	want := groupRW | groupExec
	return info.Mode().Perm()&want == want && info.Mode()&fs.ModeSetgid != 0
}

// walkChildrenFirst calls f for everything in directory d and below it,
// each directory after its entries, d last, without following symbolic
// links: f gets each entry's path (for messages), a descriptor of the
// entry itself (O_PATH|O_NOFOLLOW, or the directory's own) and its
// FileInfo from that descriptor. Entries are reached from their
// directory's descriptor, never by path. It stops when ctx ends.
func walkChildrenFirst(ctx context.Context, d *os.File, f func(path string, fd int, info fs.FileInfo)) error {
	info, err := d.Stat()
	if err != nil {
		return err
	}
	return walkDir(ctx, d, info, f)
}

func walkDir(ctx context.Context, d *os.File, info fs.FileInfo, f func(string, int, fs.FileInfo)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	entries, err := d.ReadDir(-1)
	if err != nil {
		return err
	}
	slices.SortFunc(entries, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	for _, e := range entries {
		child := filepath.Join(d.Name(), e.Name())
		if err := walkEntry(ctx, d, e.Name(), child, f); err != nil {
			return err
		}
	}
	f(d.Name(), int(d.Fd()), info)
	return nil
}

// walkEntry opens entry name of d without following it and walks it.
func walkEntry(ctx context.Context, d *os.File, name, path string, f func(string, int, fs.FileInfo)) error {
	fd, err := unix.Openat(int(d.Fd()), name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // removed meanwhile
	}
	if err != nil {
		return &fs.PathError{Op: "open", Path: path, Err: err}
	}
	entry := os.NewFile(uintptr(fd), path)
	defer entry.Close()
	info, err := entry.Stat()
	if err != nil {
		return err
	}
	if !info.IsDir() {
		f(path, fd, info)
		return nil
	}
	// The directory this descriptor holds, opened for reading: the same
	// inode, whatever its name points to now.
	dfd, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: path, Err: err}
	}
	sub := os.NewFile(uintptr(dfd), path)
	defer sub.Close()
	return walkDir(ctx, sub, info, f)
}
