package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// MountDevice implements volume.DeviceMounter. Only a Filesystem volume on
// a block device is staged: the device is formatted with the PV's fsType
// (default ext4) if it has no filesystem, and mounted (ro when the spec or
// the pod says read-only, then the PV's mountOptions) at
// {root}/plugins/kubernetes.io/local-volume/mounts/{pv}, which it returns.
// For a directory and for a Block volume it does nothing and returns "".
// Idempotent: a mount already there is kept. A mount that failed and may
// remain is an error wrapping volume.ErrInProgress; otherwise the
// directory it made is removed again.
func (p *plugin) MountDevice(ctx context.Context, req volume.DeviceRequest) (string, error) {
	spec := req.Spec
	if spec.Mode == podvol.Block {
		return "", nil
	}
	fail := func(err error) (string, error) {
		return "", fmt.Errorf("mounting the device of volume %s: %w", desc(spec), err)
	}
	pv, err := pvName(spec)
	if err != nil {
		return fail(err)
	}
	dev, kind, err := p.source(spec)
	if err != nil {
		return fail(err)
	}
	if kind == kindDirectory {
		return "", nil
	}
	path := p.deviceMountPath(pv)
	if _, err := p.rfs.Verify(path); err != nil {
		return fail(err)
	}
	mounted, err := p.mounter.IsMountPoint(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := p.rfs.MkdirAll(path, 0o750); err != nil {
			return fail(err)
		}
	case err != nil:
		return fail(fmt.Errorf("checking whether %s is a mount point: %w", path, err))
	case mounted:
		return path, nil
	}
	var opts []string
	if spec.ReadOnly || req.Pod.ReadOnly {
		opts = append(opts, "ro")
	}
	opts = append(opts, spec.MountOptions...)
	fstype := fsType(spec)
	if _, err := p.rfs.Verify(path); err != nil {
		return fail(err)
	}
	if err := p.formatter.FormatAndMount(dev, path, fstype, opts); err != nil {
		err = volume.WithCause(fmt.Errorf("mounting block device %s at %s (fsType %s): %w", dev, path, fstype, err),
			fmt.Sprintf("local: failed to mount device %s at %s (fstype: %s), error %v", dev, path, fstype, err))
		if cerr := p.unmountAndRemove(path); cerr != nil {
			return fail(fmt.Errorf("%w; cleaning up: %w: %w", err, cerr, volume.ErrInProgress))
		}
		return fail(err)
	}
	klog.FromContext(ctx).V(4).Info("Local block device mounted", "volume", spec.Name, "device", dev, "path", path, "fsType", fstype)
	return path, nil
}

// UnmountDevice implements volume.DeviceMounter: it unmounts the device
// mount of a Filesystem volume on a block device and removes its
// directory, or removes a Block volume's directory of map files. It
// refuses (a *volume.InUseError) while a pod still uses the volume: a
// mount under {root}/pods references the device mount, as the kubelet's
// GetDeviceMountRefs finds them, or a pod's map file is left. It needs
// only the spec's PVName and Mode. Idempotent: nothing staged is not an
// error (a directory's volume never is).
func (p *plugin) UnmountDevice(ctx context.Context, req volume.DeviceRequest) error {
	spec := req.Spec
	fail := func(err error) error {
		return fmt.Errorf("unmounting the device of volume %s: %w", desc(spec), err)
	}
	pv, err := pvName(spec)
	if err != nil {
		return fail(err)
	}
	if spec.Mode == podvol.Block {
		if err := p.removeGlobalMapDir(pv); err != nil {
			return fail(err)
		}
		return nil
	}
	path := p.deviceMountPath(pv)
	if _, err := p.rfs.Verify(path); err != nil {
		return fail(err)
	}
	if _, err := p.rfs.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fail(err)
	}
	refs, err := p.podRefs(path, "")
	if err != nil {
		return fail(err)
	}
	if len(refs) > 0 {
		return fail(&volume.InUseError{Path: path, Refs: refs})
	}
	if err := p.unmountAndRemove(path); err != nil {
		return fail(err)
	}
	klog.FromContext(ctx).V(4).Info("Local block device unmounted", "volume", spec.Name, "path", path)
	return nil
}
