package emptydir

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/internal/rootfs"
	"github.com/nodevol/nodevol/step"
	"github.com/nodevol/nodevol/volume"
)

// errOtherMount is wrapped by TearDown's refusals: a mount that is not the
// volume's own is at or below its directory.
var errOtherMount = errors.New("another file system is mounted there: its data is not deleted")

// TearDown implements volume.Mounter: it takes down pod
// req.Volume.Pod.UID's volume req.Volume.SpecName from its path alone (the
// spec's source is not needed), as the kubelet's TearDownAt does: it
// removes the ready file, unmounts the tmpfs or hugetlbfs mounted at the
// directory, and deletes the directory with everything in it, following
// no symlink (a link the pod planted goes, its target stays). Idempotent:
// a volume that is gone is not an error.
//
// A mount below the directory (found by walking its directories, or in
// the node's mount table where that was read), or one at it that is not a
// tmpfs or a hugetlbfs, makes it refuse before it changes anything, with
// an error naming the mount: it never deletes another file system's data.
// The one exception is a mount stacked under the volume's own tmpfs or
// hugetlbfs, which only the table shows: it is refused once the volume's
// own is unmounted. A failure once it has changed something wraps
// volume.ErrInProgress (Uncertain).
func (p *plugin) TearDown(ctx context.Context, req volume.MountRequest) error {
	vol := req.Volume
	fail := func(err error) error {
		return fmt.Errorf("tearing down emptyDir volume %q of pod %s: %w", vol.SpecName, vol.Pod, err)
	}
	at, err := p.volumePaths(vol.Pod.UID, vol.SpecName)
	if err != nil {
		return fail(err)
	}
	if err := p.tearDownAt(ctx, at); err != nil {
		return fail(err)
	}
	klog.FromContext(ctx).V(4).Info("EmptyDir volume torn down", "pod", vol.Pod, "volume", vol.SpecName, "path", at.abs)
	return nil
}

// tearDownAt takes the volume at at down (see TearDown).
func (p *plugin) tearDownAt(ctx context.Context, at paths) error {
	p, release, err := p.withRootHeld()
	if err != nil {
		return err
	}
	defer release()
	mounts, table, err := p.teardownMounts(at)
	if err != nil {
		return err
	}
	if err := p.checkMounts(ctx, at, mounts, table); err != nil {
		return err
	}
	if err := p.rfs.RemoveIn(at.readyDir, readyFile); err != nil {
		return err
	}
	// From here on a failure leaves the volume half taken down.
	uncertain := func(err error) error { return fmt.Errorf("%w: %w", err, volume.ErrInProgress) }
	for len(mounts) > 0 {
		for range mounts {
			if _, err := p.rfs.Verify(at.dir); err != nil {
				return uncertain(err)
			}
			if err := p.mounter.Unmount(at.abs); err != nil {
				return uncertain(fmt.Errorf("unmounting %s: %w", at.abs, err))
			}
		}
		if table != nil {
			break // the table listed every mount stacked there
		}
		// Only the top mount was seen (teardownMounts): it may have
		// covered another. Rare, so found only now: what is stacked
		// there, and below, is refused as before, but Uncertain.
		if mounts, table, err = p.mountsAt(at); err != nil {
			return uncertain(err)
		}
		if len(mounts) > 0 {
			if err := p.checkMounts(ctx, at, mounts, table); err != nil {
				return uncertain(err)
			}
		}
	}
	if err := p.removeVolumeDir(ctx, at); err != nil {
		return uncertain(err)
	}
	return nil
}

// teardownMounts returns the mounts at the volume directory at, the lowest
// first, and the node's mount table when it read it, as mountsAt does; but
// where the directory is the root of a mount of the plugin's own types
// (ownMountRoot), that mount alone, from the directory itself: a memory
// volume's teardown then does not read the table, every mount of the node,
// which the teardowns of many pods' volumes at once would each read. A
// mount stacked under that one is found once it is unmounted (tearDownAt).
func (p *plugin) teardownMounts(at paths) (mounts, table []mount.MountPoint, err error) {
	notMnt, err := p.mounter.IsLikelyNotMountPoint(at.abs)
	if err == nil && !notMnt {
		if mp, ok := p.ownMountRoot(at); ok {
			return []mount.MountPoint{mp}, nil, nil
		}
	}
	return p.mountsAtChecked(at, notMnt, err)
}

// checkMounts refuses the teardown of the volume at at when a mount at its
// directory (mounts) is not of the plugin's own types, or a mount is below
// it (mountsBelow, from table when it was read).
func (p *plugin) checkMounts(ctx context.Context, at paths, mounts, table []mount.MountPoint) error {
	for _, mp := range mounts {
		if !ownMount(mp) {
			return fmt.Errorf("%s (%s): %w", at.abs, mp.Type, errOtherMount)
		}
	}
	below, err := p.mountsBelow(ctx, at, table)
	if err != nil {
		return err
	}
	if len(below) > 0 {
		return fmt.Errorf("%s: %w", strings.Join(below, ", "), errOtherMount)
	}
	return nil
}

// mountsBelow returns the mount points inside the volume directory, found
// before anything is removed: those of the mount table, when mountsAt read
// it (or the kernel does not say which directories are mount roots: then
// it is read here), else by walking the volume's directories from
// descriptors (no symlink followed): a directory that is a mount's root or
// on another device than the volume (isMountRoot), or one the mounter says
// is a mount point (a fake mounter knows only its table). The walk does not
// descend into them. It costs a read of each of the volume's directories,
// where the table is every mount of the node (but once read, the table is
// the kernel's own list: no walk then); the remover checks each directory
// again, for a mount made since.
func (p *plugin) mountsBelow(ctx context.Context, at paths, table []mount.MountPoint) ([]string, error) {
	if table == nil && !p.mountRootsKnown() {
		var err error
		if table, err = p.tables.list(p.mounter); err != nil {
			return nil, fmt.Errorf("listing mount points: %w", err)
		}
	}
	if table != nil {
		var below []string
		prefix := at.abs + "/"
		for _, mp := range table {
			if strings.HasPrefix(mp.Path, prefix) {
				below = append(below, mp.Path)
			}
		}
		return below, nil
	}
	fd, err := p.rfs.OpenDirFd(at.dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, nil
	case isNotDir(err):
		return nil, nil // a symlink or a file: removed itself, nothing below it
	case err != nil:
		return nil, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, &fs.PathError{Op: "stat", Path: at.abs, Err: err}
	}
	var below []string
	err = p.findMounts(ctx, fd, at.abs, st.Dev, &below)
	return below, err
}

// isNotDir reports whether err is a rootfs refusal of a last component
// that is a symlink or not a directory.
func isNotDir(err error) bool {
	return errors.Is(err, rootfs.ErrSymlink) || errors.Is(err, rootfs.ErrNotDir)
}

// findMounts adds to below the mount points among the directories in
// directory d, at dir, and those below the others (see mountsBelow).
func (p *plugin) findMounts(ctx context.Context, d int, dir string, dev uint64, below *[]string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	entries, err := readDir(d)
	if err != nil {
		return &fs.PathError{Op: "readdir", Path: dir, Err: err}
	}
	for _, e := range entries {
		if e.typ != unix.DT_DIR && e.typ != unix.DT_UNKNOWN {
			continue
		}
		full := filepath.Join(dir, e.name)
		cfd, err := unix.Openat(d, e.name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		switch err {
		case nil:
		case unix.ENOENT, unix.ELOOP, unix.ENOTDIR:
			continue // gone, or swapped for a link or a file: no directory to look into
		default:
			return &fs.PathError{Op: "open", Path: full, Err: err}
		}
		if isMountRoot(cfd, dev) || p.mountedAt(full) {
			*below = append(*below, full)
			unix.Close(cfd)
			continue
		}
		err = p.findMounts(ctx, cfd, full, dev, below)
		unix.Close(cfd)
		if err != nil {
			return err
		}
	}
	return nil
}

// mountedAt reports whether the mounter says something is mounted at dir.
func (p *plugin) mountedAt(dir string) bool {
	notMnt, err := p.mounter.IsLikelyNotMountPoint(dir)
	return err == nil && !notMnt
}

// removeVolumeDir deletes the volume directory and everything in it; a
// missing directory is not an error, and anything else in its place (a
// symlink, a file) is removed itself, never followed.
func (p *plugin) removeVolumeDir(ctx context.Context, at paths) error {
	d, err := p.rfs.OpenDirFd(at.dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case isNotDir(err):
		return p.rfs.RemoveAny(at.dir)
	case err != nil:
		return err
	}
	defer unix.Close(d)
	var st unix.Stat_t
	if err := unix.Fstat(d, &st); err != nil {
		return &fs.PathError{Op: "stat", Path: at.abs, Err: err}
	}
	rm := remover{ctx: ctx, steps: p.steps, dev: st.Dev}
	if err := rm.contents(d, at.abs); err != nil {
		return err
	}
	return p.rfs.Remove(at.dir)
}

// remover deletes a directory's contents, depth first, from directory
// descriptors: nothing is reached by path, no symlink is followed (a link
// is removed as a link), and a directory that is the root of a mount (or
// on another device than the volume) stops it with an error naming it,
// before anything in it is touched.
type remover struct {
	ctx   context.Context
	steps step.Hook
	// dev is the volume's device.
	dev uint64
}

// contents removes everything in directory d, at dir (for messages). An
// entry's type is the one its listing gives (a stat only where the file
// system gives none); were it swapped since, unlinkat fails (EISDIR: the
// directory is emptied and removed) or removes the new entry itself,
// never following it.
func (r remover) contents(d int, dir string) error {
	if err := r.ctx.Err(); err != nil {
		return err
	}
	entries, err := readDir(d)
	if err != nil {
		return &fs.PathError{Op: "readdir", Path: dir, Err: err}
	}
	for _, e := range entries {
		full := filepath.Join(dir, e.name)
		isDir := e.typ == unix.DT_DIR
		if e.typ == unix.DT_UNKNOWN {
			var st unix.Stat_t
			if err := unix.Fstatat(d, e.name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				if err == unix.ENOENT {
					continue
				}
				return &fs.PathError{Op: "stat", Path: full, Err: err}
			}
			isDir = st.Mode&unix.S_IFMT == unix.S_IFDIR
		}
		if err := r.remove(d, e.name, full, isDir); err != nil {
			return err
		}
	}
	return nil
}

// remove removes entry name of directory d, emptied first if it is a
// directory.
func (r remover) remove(d int, name, full string, isDir bool) error {
	flags := 0
	if isDir {
		if err := r.subdir(d, name, full); err != nil {
			return err
		}
		flags = unix.AT_REMOVEDIR
	}
	if err := r.steps.Take(step.Remove, full); err != nil {
		return &fs.PathError{Op: "remove", Path: full, Err: err}
	}
	// unlinkat never follows name: were it swapped since, the new entry
	// itself would go, or the call fail.
	err := unix.Unlinkat(d, name, flags)
	if err == unix.EISDIR && !isDir {
		return r.remove(d, name, full, true)
	}
	if err != nil && err != unix.ENOENT {
		return &fs.PathError{Op: "remove", Path: full, Err: err}
	}
	return nil
}

// subdir empties directory name of parent fd, after checking that it is
// no mount's root.
func (r remover) subdir(parent int, name, full string) error {
	cfd, err := unix.Openat(parent, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: full, Err: err}
	}
	defer unix.Close(cfd)
	if isMountRoot(cfd, r.dev) {
		return fmt.Errorf("%s: %w", full, errOtherMount)
	}
	return r.contents(cfd, full)
}

// isMountRoot reports whether the directory open at fd is the root of a
// mount (statx's STATX_ATTR_MOUNT_ROOT, Linux 5.8 and later) or on another
// device than dev; an error of statx counts as a mount root.
func isMountRoot(fd int, dev uint64) bool {
	var stx unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BASIC_STATS, &stx); err != nil {
		return true
	}
	if stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 && stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0 {
		return true
	}
	return unix.Mkdev(stx.Dev_major, stx.Dev_minor) != dev
}
