package nfs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"syscall"

	"k8s.io/klog/v2"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/internal/rootfs"
	"github.com/nodevol/nodevol/step"
	"github.com/nodevol/nodevol/volume"
)

// SetUp implements volume.Mounter: it mounts the export at
// {root}/pods/{uid}/volumes/kubernetes.io~nfs/{name} with type nfs and
// the kubelet's options, and returns that path. A directory that is a
// mount point already is kept as it is (the kubelet's check: whatever is
// mounted there). A mount that fails is taken back: unmounted if it left
// a mount, its directory removed; the error names the pod, the volume,
// the server and the mounter's error (the kubelet's words); it wraps
// volume.ErrInProgress only when a mount may remain.
func (p *plugin) SetUp(ctx context.Context, req volume.MountRequest) (string, error) {
	spec, vol := req.Spec, req.Volume
	src, err := sourceOf(spec, vol)
	if err != nil {
		return "", fmt.Errorf("mounting %s for pod %s: %w", desc(spec, vol, nil), vol.Pod, err)
	}
	fail := func(err error) (string, error) {
		return "", fmt.Errorf("mounting %s for pod %s: %w", desc(spec, vol, &src), vol.Pod, err)
	}
	dir, err := p.podDir(spec, vol)
	if err != nil {
		return fail(err)
	}
	if _, err := p.rfs.Verify(dir); err != nil {
		return fail(err)
	}
	mounted, err := p.mounter.IsMountPoint(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		// The kubelet returns the check's error as it is.
		return fail(fmt.Errorf("checking whether %s is a mount point: %w", dir, volume.Cause(err)))
	case mounted:
		klog.FromContext(ctx).V(4).Info("NFS volume already mounted", "pod", klog.KRef(vol.Pod.Namespace, vol.Pod.Name), "volume", vol.SpecName, "path", dir)
		return dir, nil
	}
	if err := p.rfs.MkdirAll(dir, 0o750); err != nil {
		return fail(err)
	}
	if _, err := p.rfs.Verify(dir); err != nil {
		return fail(err)
	}
	err = p.mounter.MountSensitiveWithoutSystemd(src.device(), dir, fsType, src.options, nil)
	if err != nil {
		// The mounter's error (mount's exit status, its arguments, and
		// mount.nfs's output) is what the kubelet returns.
		err = fmt.Errorf("mounting %s at %s (type %s, options %v): %w", src.device(), dir, fsType, src.options, volume.Cause(err))
		// As the kubelet, a failed mount is taken back with a plain
		// unmount, never a forced one.
		if cerr := p.cleanup(dir, false); cerr != nil {
			return fail(fmt.Errorf("%w; taking it back: %w", err, cerr))
		}
		return fail(err)
	}
	klog.FromContext(ctx).V(4).Info("NFS volume mounted", "pod", klog.KRef(vol.Pod.Namespace, vol.Pod.Name), "volume", vol.SpecName,
		"source", src.device(), "options", src.options, "path", dir)
	return dir, nil
}

// TearDown implements volume.Mounter: it unmounts the pod's mount of the
// volume (forced after a minute, when the mounter can force one) and
// removes its directory, never what is in it. It needs only the pod's UID
// and the directory's name (the spec's PV name, else the pod volume's
// name), so that it works on a volume found on disk. Idempotent. An
// unmount that failed, or a directory that cannot be examined, is an
// error wrapping volume.ErrInProgress: the mount may remain.
func (p *plugin) TearDown(ctx context.Context, req volume.MountRequest) error {
	spec, vol := req.Spec, req.Volume
	fail := func(err error) error {
		return fmt.Errorf("unmounting %s from pod %s: %w", desc(spec, vol, nil), vol.Pod, err)
	}
	dir, err := p.podDir(spec, vol)
	if err != nil {
		return fail(err)
	}
	if err := p.cleanup(dir, true); err != nil {
		return fail(err)
	}
	klog.FromContext(ctx).V(4).Info("NFS volume unmounted", "pod", klog.KRef(vol.Pod.Namespace, vol.Pod.Name), "volume", vol.SpecName, "path", dir)
	return nil
}

// cleanup is the kubelet's CleanupMountPoint with its extensive check: it
// unmounts dir while it is a mount point and removes it once it is not
// (only an empty directory goes). force uses the mounter's forced unmount
// when it has one. A missing dir is not an error.
func (p *plugin) cleanup(dir string, force bool) error {
	for unmounted := false; ; unmounted = true {
		mounted, err := p.isMountPoint(dir)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return nil
		case err != nil:
			return err
		case !mounted:
			if err := p.rfs.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("removing %s: %w", dir, err)
			}
			return nil
		case unmounted:
			return fmt.Errorf("failed to cleanup mount point %s: still a mount point after it was unmounted: %w", dir, volume.ErrInProgress)
		}
		if err := p.unmount(dir, force); err != nil {
			return fmt.Errorf("unmounting %s: %w: %w", dir, volume.Cause(err), volume.ErrInProgress)
		}
	}
}

// isMountPoint reports whether dir, a pod's volume directory, is a mount
// point, as the kubelet's clean-up asks: from the mount table, not by a
// change of device, since a server's root_squash may refuse the node a
// stat of the export. A mount whose server is gone (the kubelet's
// corrupted mount: ESTALE, ENOTCONN, EIO, ...) is a mount point without
// asking. A symlink, at dir or above it, or anything but a directory at
// dir is an error: never followed, never removed. An error that leaves
// the question open wraps volume.ErrInProgress.
func (p *plugin) isMountPoint(dir string) (bool, error) {
	fi, err := p.lstat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, err
	case corrupted(err):
		return true, nil
	case errors.Is(err, rootfs.ErrSymlink):
		return false, err
	case err != nil:
		return false, fmt.Errorf("examining %s: %w: %w", dir, err, volume.ErrInProgress)
	case !fi.IsDir():
		return false, fmt.Errorf("%s is not a directory (%s): left alone", dir, fi.Mode().Type())
	}
	mounted, err := p.mounter.IsMountPoint(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, err
	case corrupted(err):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("checking whether %s is a mount point: %w: %w", dir, err, volume.ErrInProgress)
	}
	return mounted, nil
}

// corrupted reports whether err says a mount's file system no longer
// answers (its server is gone): mount-utils' IsCorruptedMnt on the
// system's error, wherever it is in err's chain.
func corrupted(err error) bool {
	var errno syscall.Errno
	return errors.As(err, &errno) && mount.IsCorruptedMnt(errno)
}

// unmount unmounts dir: with the mounter's forced unmount (a plain one,
// then "umount -f" after unmountTimeout) when force is set and it has
// one, as the kubelet tears an nfs volume down.
func (p *plugin) unmount(dir string, force bool) error {
	if !force || p.force == nil {
		return p.mounter.Unmount(dir)
	}
	if err := p.steps.Take(step.Unmount, dir); err != nil {
		return err
	}
	return p.force.UnmountWithForce(dir, unmountTimeout)
}
