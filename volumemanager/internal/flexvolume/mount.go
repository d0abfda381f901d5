package flexvolume

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/internal/blockdev"
	"github.com/nodevol/nodevol/internal/fsgroup"
	"github.com/nodevol/nodevol/volume"
)

// SetUp implements volume.Mounter: `mount {dir} {json}` at the pod's
// directory of the volume, which it returns. A directory that is already
// a mount point is kept without a call, as the kubelet keeps it. A driver
// that does not support mount gets the kubelet's default: a bind mount of
// the volume's device mount. On a failure the directory is removed (not
// on a timeout, after which the mount may remain: that error wraps
// volume.ErrInProgress). With req.ChangeOwnership, on a writable volume,
// the pod's fsGroup then gets ownership of the files; as the kubelet, a
// failure of that change is logged, not returned.
func (d *driver) SetUp(ctx context.Context, req volume.MountRequest) (string, error) {
	spec, vol := req.Spec, req.Volume
	name := d.volumeName(spec, vol.SpecName)
	if vol.PVName != "" {
		name = vol.PVName
	}
	fail := func(err error) (string, error) {
		return "", fmt.Errorf("mounting volume %s for pod %s: %w", d.desc(name), vol.Pod, err)
	}
	s, err := sourceOf(spec, name, vol.ReadOnly)
	if err != nil {
		return fail(err)
	}
	dir, err := d.podDir(vol.Pod.UID, name)
	if err != nil {
		return fail(err)
	}
	if mounted, err := d.prepareForMount(dir); err != nil {
		return fail(err)
	} else if mounted {
		return dir, nil
	}
	extra, err := d.mountOptions(ctx, s, vol)
	if err == nil {
		err = d.mount(ctx, s, dir, extra)
	}
	if err != nil {
		if errors.Is(err, volume.ErrInProgress) {
			return fail(err)
		}
		if rerr := d.rfs.Remove(dir); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			klog.FromContext(ctx).Error(rerr, "Cannot remove a flexVolume directory after a failed mount", "path", dir)
		}
		return fail(err)
	}
	if req.ChangeOwnership && vol.FSGroup != nil && !s.readOnly && d.caps.FSGroup {
		d.changeOwnership(ctx, dir, req)
	}
	klog.FromContext(ctx).V(4).Info("FlexVolume mounted", "pod", klog.KRef(vol.Pod.Namespace, vol.Pod.Name), "volume", name, "driver", d.name, "path", dir)
	return dir, nil
}

// mount runs the driver's mount, or the kubelet's default when the driver
// does not support it. A call cut short by ctx wraps volume.ErrInProgress.
func (d *driver) mount(ctx context.Context, s source, dir string, extra map[string]string) error {
	opts, err := s.json(extra)
	if err != nil {
		return err
	}
	_, err = d.run(ctx, call{cmdMount, []string{dir, opts}})
	switch {
	case errors.Is(err, errNotSupported):
		return d.defaultMount(ctx, s, dir)
	case ctx.Err() != nil:
		return fmt.Errorf("%w: %w", volume.Cause(err), volume.ErrInProgress)
	}
	return volume.Cause(err)
}

// defaultMount is the kubelet's mount when the driver does not support
// mount: a bind mount of the volume's device mount.
func (d *driver) defaultMount(ctx context.Context, s source, dir string) error {
	klog.FromContext(ctx).Info("FlexVolume driver does not support mount: bind-mounting its device mount", "driver", d.name, "path", dir)
	if err := d.getVolumeName(ctx, s); err != nil {
		return volume.Cause(err)
	}
	src, err := d.deviceMountPath(s.name)
	if err != nil {
		return err
	}
	if err := d.mounter.MountSensitiveWithoutSystemd(src, dir, defaultFSTypeMount, []string{"bind"}, nil); err != nil {
		return volume.Cause(err)
	}
	return nil
}

// changeOwnership gives the pod's fsGroup the volume's files; a failure is
// logged only, as the kubelet ignores it for a flexVolume.
func (d *driver) changeOwnership(ctx context.Context, dir string, req volume.MountRequest) {
	vol := req.Volume
	f, err := d.rfs.OpenDir(dir)
	if err == nil {
		err = d.ownership.Change(ctx, fsgroup.Request{
			Dir: f, GID: *vol.FSGroup, OnRootMismatch: vol.FSGroupOnRootMismatch,
			Pod:    v1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: vol.Pod.Namespace, Name: vol.Pod.Name, UID: vol.Pod.UID},
			Volume: vol.SpecName,
		})
		f.Close()
	}
	if err != nil {
		klog.FromContext(ctx).Error(err, "Cannot give the pod's fsGroup ownership of a flexVolume", "pod", klog.KRef(vol.Pod.Namespace, vol.Pod.Name), "driver", d.name, "path", dir)
	}
}

// TearDown implements volume.Mounter: `unmount {dir}`, or the kubelet's
// default when the driver does not support it (unmount while a mount
// point), then the directory is removed. A directory that is gone needs no
// call. It needs only the pod's UID and the volume's name, so that it
// works on a volume found on disk. A failure wraps volume.ErrInProgress:
// the mount may remain.
func (d *driver) TearDown(ctx context.Context, req volume.MountRequest) error {
	vol := req.Volume
	name := d.volumeName(req.Spec, vol.SpecName)
	if vol.PVName != "" {
		name = vol.PVName
	}
	fail := func(err error) error {
		return fmt.Errorf("unmounting volume %s from pod %s: %w", d.desc(name), vol.Pod, err)
	}
	dir, err := d.podDir(vol.Pod.UID, name)
	if err != nil {
		return fail(err)
	}
	if _, err := d.rfs.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fail(err)
	}
	_, err = d.run(ctx, call{cmdUnmount, []string{dir}})
	if errors.Is(err, errNotSupported) {
		err = blockdev.CleanupMountPoint(d.rfs, d.mounter, dir)
	} else if err != nil {
		err = volume.Cause(err)
	}
	if err == nil {
		err = d.removeDir(dir)
	}
	if err != nil {
		return fail(fmt.Errorf("%w: %w", err, volume.ErrInProgress))
	}
	klog.FromContext(ctx).V(4).Info("FlexVolume unmounted", "pod", klog.KRef(vol.Pod.Namespace, vol.Pod.Name), "volume", name, "driver", d.name, "path", dir)
	return nil
}

// prepareForMount reports whether path is a mount point already, and
// makes it (0750) when it is missing, as the kubelet's prepareForMount;
// no symlink below the root is followed. Unlike the kubelet's, its check
// sees a bind mount of a directory of the same file system.
func (d *driver) prepareForMount(path string) (mounted bool, err error) {
	if _, err := d.rfs.Verify(path); err != nil {
		return false, err
	}
	mounted, err = d.mounter.IsMountPoint(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return false, fmt.Errorf("checking whether %s is a mount point: %w", path, err)
	case mounted:
		return true, nil
	}
	return false, d.rfs.MkdirAll(path, 0o750)
}

// removeDir removes path when it is there: it must be an empty directory
// and no mount point (rootfs refuses anything else).
func (d *driver) removeDir(path string) error {
	if err := d.rfs.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", path, err)
	}
	return nil
}
