package emptydir

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strconv"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/internal/fsgroup"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// SetUp implements volume.Mounter: it sets the volume up at
// {root}/pods/{uid}/volumes/kubernetes.io~empty-dir/{name} and returns
// that path, as the kubelet's SetUpAt does:
//
//   - when the ready file is there and the volume is whole (on disk: the
//     directory exists; medium Memory: something is mounted there) it does
//     nothing (with hugepages: a hugetlbfs of its page size is mounted
//     there); a disk volume whose directory is gone loses its ready file
//     and is set up again;
//   - otherwise it creates the directory (mode 0777, whatever the umask),
//     mounts a tmpfs (medium Memory) or a hugetlbfs (hugepages) there
//     unless one is mounted already, gives the pod's fsGroup ownership of
//     it when req.ChangeOwnership says so, and writes the ready file.
//
// An error once the directory exists wraps volume.ErrInProgress: the
// volume is Uncertain, set up again or torn down.
func (p *plugin) SetUp(ctx context.Context, req volume.MountRequest) (string, error) {
	vol := req.Volume
	fail := func(err error) (string, error) {
		return "", fmt.Errorf("setting up emptyDir volume %q of pod %s: %w", vol.SpecName, vol.Pod, err)
	}
	if req.Spec == nil {
		return fail(errors.New("nil spec"))
	}
	at, err := p.volumePaths(vol.Pod.UID, vol.SpecName)
	if err != nil {
		return fail(err)
	}
	m, err := mediumOf(req.Spec)
	if err != nil {
		return fail(err)
	}
	if err := p.setUpAt(ctx, at, m, vol, req.ChangeOwnership); err != nil {
		return fail(err)
	}
	return at.abs, nil
}

// setUpAt sets the volume up at at (see SetUp); an error once the
// directory exists wraps volume.ErrInProgress.
func (p *plugin) setUpAt(ctx context.Context, at paths, m medium, vol podvol.PodVolume, changeOwnership bool) error {
	p, release, err := p.withRootHeld()
	if err != nil {
		return err
	}
	defer release()
	done, err := p.readyAndWhole(at, m)
	if err != nil || done {
		if err == nil {
			klog.FromContext(ctx).V(4).Info("EmptyDir volume is set up already", "pod", vol.Pod, "volume", vol.SpecName, "path", at.abs)
		}
		return err
	}
	if err := p.makeDir(at); err != nil {
		return err
	}
	// From here on the directory exists: an error leaves it Uncertain, to
	// be set up again or torn down. makeDir has just resolved its path
	// from the held root, no symlink followed: that is the check before
	// the mount (rootfs.Root.Verify's).
	if err := p.mountMedium(ctx, at, m, vol); err != nil {
		return fmt.Errorf("%w: %w", err, volume.ErrInProgress)
	}
	if changeOwnership && vol.FSGroup != nil {
		if err := p.changeOwnership(ctx, at, vol); err != nil {
			return fmt.Errorf("giving fsGroup %d ownership of %s: %w: %w", *vol.FSGroup, at.abs, err, volume.ErrInProgress)
		}
	}
	if err := p.makeReady(at); err != nil {
		return fmt.Errorf("%w: %w", err, volume.ErrInProgress)
	}
	klog.FromContext(ctx).V(4).Info("EmptyDir volume set up", "pod", vol.Pod, "volume", vol.SpecName, "medium", m.name, "path", at.abs)
	return nil
}

// readyAndWhole reports whether the volume is set up already, as the
// kubelet decides it: its ready file is there and, on disk, the directory
// exists; in memory, something is mounted at it; with hugepages, a
// hugetlbfs of its page size is (where the kubelet checks the mount and
// walks the fsGroup ownership again, to the same end). A disk volume's
// ready file without its directory is removed (the kubelet's warning
// case: someone deleted the directory).
func (p *plugin) readyAndWhole(at paths, m medium) (bool, error) {
	if !p.isReady(at) {
		return false, nil
	}
	switch m.kind {
	case onDisk:
		fi, err := p.rfs.Stat(at.dir)
		switch {
		case err == nil && fi.IsDir():
			return true, nil
		case err == nil:
			return false, fmt.Errorf("%s is not a directory (%v)", at.abs, fi.Mode().Type())
		case !errors.Is(err, fs.ErrNotExist):
			return false, err
		}
		if err := p.rfs.RemoveIn(at.readyDir, readyFile); err != nil {
			return false, fmt.Errorf("the ready file is there but the volume directory %s is not; removing the ready file: %w", at.abs, err)
		}
		return false, nil
	}
	if m.kind == inMemory {
		// Mounted at all is enough, as for the kubelet: no mount table.
		return p.somethingMountedAt(at)
	}
	mounts, _, err := p.mountsAt(at)
	if err != nil {
		return false, err
	}
	if len(mounts) == 0 {
		return false, nil
	}
	top := mounts[len(mounts)-1]
	return top.Type == hugetlbfsType && checkPageSize(top, m) == nil, nil
}

// isReady reports whether the volume's ready file is there, a regular file.
func (p *plugin) isReady(at paths) bool {
	fi, err := p.rfs.Stat(at.ready())
	return err == nil && fi.Mode().IsRegular()
}

// makeReady writes the volume's ready file (the kubelet's SetReady),
// taking back whatever else is in its place; a ready file there already is
// kept (O_EXCL tells it).
func (p *plugin) makeReady(at paths) error {
	if err := p.rfs.MkdirAll(at.readyDir, parentDirMode); err != nil {
		return err
	}
	err := p.rfs.Create(at.ready(), readyFileMode)
	if !errors.Is(err, fs.ErrExist) {
		return err
	}
	if p.isReady(at) {
		return nil
	}
	if err := p.rfs.RemoveAny(at.ready()); err != nil {
		return err
	}
	return p.rfs.Create(at.ready(), readyFileMode)
}

// makeDir creates the volume directory with the kubelet's mode 0777: one
// it makes is chmod'ed (the umask takes bits away); one that is there is
// chmod'ed when the umask took bits away (a mode set on it since, such as
// the setgid bit of an fsGroup, is kept when its permissions are right).
func (p *plugin) makeDir(at paths) error {
	if err := p.rfs.MkdirAll(path.Dir(at.dir), parentDirMode); err != nil {
		return err
	}
	err := p.rfs.Mkdir(at.dir, volumeDirMode)
	if err == nil {
		return p.rfs.SetMode(at.dir, volumeDirMode, -1, -1)
	}
	if !errors.Is(err, fs.ErrExist) {
		return err
	}
	d, err := p.rfs.OpenDir(at.dir)
	if err != nil {
		return err
	}
	defer d.Close()
	fi, err := d.Stat()
	if err != nil {
		return err
	}
	if fi.Mode().Perm() == volumeDirMode {
		return nil
	}
	if err := d.Chmod(volumeDirMode); err != nil {
		return fmt.Errorf("chmod %o %s: %w", volumeDirMode, at.abs, err)
	}
	return nil
}

// mountMedium mounts a memory volume's tmpfs or a hugepages volume's
// hugetlbfs at its directory, unless one is mounted there already. Called
// right after makeDir, whose resolution of the directory's path (no
// symlink followed) is the check before the path is handed to the
// mounter.
func (p *plugin) mountMedium(ctx context.Context, at paths, m medium, vol podvol.PodVolume) error {
	if m.kind == onDisk {
		return nil
	}
	mounts, _, err := p.mountsAt(at)
	if err != nil {
		return err
	}
	var top *mount.MountPoint
	if len(mounts) > 0 {
		top = &mounts[len(mounts)-1]
	}
	source, fstype, opts := "tmpfs", tmpfsType, m.tmpfsOptions(p.noswap)
	if m.kind == hugePages {
		source, fstype, opts = "nodev", hugetlbfsType, []string{"pagesize=" + m.pageSize}
		if top != nil && top.Type == hugetlbfsType {
			if err := checkPageSize(*top, m); err != nil {
				// The kubelet's words start with the pod.
				return volume.WithCause(err, fmt.Sprintf("pod %v: %v", vol.Pod.UID, err))
			}
			return nil
		}
	} else if top != nil && top.Type == tmpfsType {
		return nil
	}
	klog.FromContext(ctx).V(3).Info("Mounting the volume's file system", "kind", p.title, "pod", vol.Pod, "volume", vol.SpecName, "type", fstype, "options", opts)
	if err := p.mounter.MountSensitiveWithoutSystemd(source, at.abs, fstype, opts, nil); err != nil {
		// The mounter's error is the kubelet's words: it returns it as it is.
		return fmt.Errorf("mounting %s at %s: %w", fstype, at.abs, volume.Cause(err))
	}
	return nil
}

// tmpfsOptions are a memory volume's tmpfs options, the kubelet's: its
// size when bounded, noswap when the kernel has it.
func (m medium) tmpfsOptions(noswap func() bool) []string {
	var opts []string
	if m.size > 0 {
		opts = append(opts, "size="+strconv.FormatInt(m.size, 10))
	}
	if noswap != nil && noswap() {
		opts = append(opts, "noswap")
	}
	return opts
}

// checkPageSize checks that the hugetlbfs mp mounted at a volume has the
// page size its medium asks for (any, for medium HugePages), with the
// kubelet's errors.
func checkPageSize(mp mount.MountPoint, m medium) error {
	if m.name == v1.StorageMediumHugePages {
		return nil
	}
	got := mountPageSize(mp)
	if got == "" {
		return fmt.Errorf("mounted dir %s pagesize is not determined", mp.Path)
	}
	have, err1 := resource.ParseQuantity(got)
	want, err2 := resource.ParseQuantity(m.pageSize)
	if err := errors.Join(err1, err2); err != nil {
		return fmt.Errorf("comparing the page size of %s: %w", mp.Path, err)
	}
	if have.Cmp(want) != 0 {
		return fmt.Errorf("mounted dir %s pagesize '%s' and requested medium size '%s' differ", mp.Path, have.String(), want.String())
	}
	return nil
}

// changeOwnership gives the pod's fsGroup ownership of the volume
// (internal/fsgroup), its directory opened without following a symlink.
func (p *plugin) changeOwnership(ctx context.Context, at paths, vol podvol.PodVolume) error {
	d, err := p.rfs.OpenDir(at.dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return p.ownership.Change(ctx, fsgroup.Request{
		Dir: d, GID: *vol.FSGroup, OnRootMismatch: vol.FSGroupOnRootMismatch,
		Pod:    v1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: vol.Pod.Namespace, Name: vol.Pod.Name, UID: vol.Pod.UID},
		Volume: vol.SpecName,
	})
}
