// Package du measures a volume's usage as the kubelet's du metrics do
// (pkg/volume/metrics_du.go): the bytes and inodes of a walk of the
// volume's directory, and the capacity and free counts of the file system
// it is on. The emptyDir plugin measures with it at each call (the kubelet
// keeps no emptyDir figure), and the plugins whose volumes are a wrapped
// emptyDir (configMap, secret, downwardAPI, projected) through a Cache, as
// the kubelet wraps their du metrics in its cached metrics. Statfs is the
// kubelet's statfs metrics (pkg/volume/metrics_statfs.go), for the plugins
// whose volume is a whole file system (local, nfs).
package du

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/nodevol/nodevol/volume"
)

// Opener opens a volume's directory without following a symlink and
// without leaving the root (rootfs.Root).
type Opener interface {
	OpenDir(name string) (*os.File, error)
}

// Measure returns the usage of the directory at path, opened through
// root: UsedBytes and InodesUsed from a walk (st_blocks of each file and
// directory, hard links counted once, the directory itself included,
// nothing on another device), the rest from statfs of the file system the
// directory is on. The walk follows no symlink and reaches nothing by path
// below the directory (each directory is opened from its parent's
// handle); an entry removed meanwhile is skipped. The error names path.
func Measure(ctx context.Context, root Opener, path string) (volume.Stats, error) {
	d, err := root.OpenDir(path)
	if err != nil {
		return volume.Stats{}, err
	}
	defer d.Close()
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(int(d.Fd()), &sfs); err != nil {
		return volume.Stats{}, &fs.PathError{Op: "statfs", Path: path, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(d.Fd()), &st); err != nil {
		return volume.Stats{}, &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	u := usage{ctx: ctx, dev: st.Dev, seen: map[uint64]bool{}}
	u.count(&st)
	if err := u.entries(d, path); err != nil {
		return volume.Stats{}, err
	}
	bsize := int64(sfs.Bsize)
	return volume.Stats{
		CapacityBytes:  int64(sfs.Blocks) * bsize,
		AvailableBytes: int64(sfs.Bavail) * bsize,
		UsedBytes:      u.bytes,
		Inodes:         int64(sfs.Files),
		InodesFree:     int64(sfs.Ffree),
		InodesUsed:     u.inodes,
	}, nil
}

// usage is a du-style walk's running totals.
type usage struct {
	ctx context.Context
	// dev is the volume's device: nothing on another is counted.
	dev           uint64
	bytes, inodes int64
	// seen are the inodes of files with more than one link, counted once.
	seen map[uint64]bool
}

// count adds one inode and its blocks, a file with several links once.
func (u *usage) count(st *unix.Stat_t) {
	if st.Nlink > 1 && st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if u.seen[st.Ino] {
			return
		}
		u.seen[st.Ino] = true
	}
	u.bytes += st.Blocks * 512
	u.inodes++
}

// entries counts what directory d holds, descending into directories on
// the volume's device; an entry removed meanwhile is skipped.
func (u *usage) entries(d *os.File, dir string) error {
	if err := u.ctx.Err(); err != nil {
		return fmt.Errorf("walking %s: %w", dir, err)
	}
	names, err := d.Readdirnames(-1)
	if err != nil {
		return &fs.PathError{Op: "readdir", Path: dir, Err: err}
	}
	fd := int(d.Fd())
	for _, name := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if err == unix.ENOENT {
				continue
			}
			return &fs.PathError{Op: "stat", Path: filepath.Join(dir, name), Err: err}
		}
		if st.Dev != u.dev {
			continue
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			u.count(&st)
			continue
		}
		if err := u.subdir(fd, name, filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	return nil
}

func (u *usage) subdir(parent int, name, full string) error {
	cfd, err := unix.Openat(parent, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		return nil
	}
	if err != nil {
		return &fs.PathError{Op: "open", Path: full, Err: err}
	}
	c := os.NewFile(uintptr(cfd), full)
	defer c.Close()
	var st unix.Stat_t
	if err := unix.Fstat(cfd, &st); err != nil {
		return &fs.PathError{Op: "stat", Path: full, Err: err}
	}
	if st.Dev != u.dev {
		return nil // swapped for a mount meanwhile
	}
	u.count(&st)
	return u.entries(c, full)
}
