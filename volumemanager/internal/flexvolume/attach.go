package flexvolume

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/internal/blockdev"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// publishDevicePath is the key of the device path in a volume's publish
// context: what the attach (or the Node's status.volumesAttached) gave
// and waitforattach returned.
const publishDevicePath = "devicePath"

// errNotAttached is the kubelet's words for a volume the Node's
// status.volumesAttached does not list yet.
//
//lint:ignore ST1005 the kubelet's text, which events carry
var errNotAttached = errors.New("Volume not attached according to node status")

// WaitForAttach implements volume.Attacher for a driver that attaches,
// with the attach/detach controller: once the Node's
// status.volumesAttached lists the volume (as the kubelet's
// VerifyControllerAttachedVolume waits for it), `waitforattach
// {devicePath} {json}` returns the device; a driver that does not support
// it keeps the listed device path. Not listed yet is an error wrapping
// volume.ErrNotReady. (nil, nil) for a driver that does not attach.
func (d *driver) WaitForAttach(ctx context.Context, spec *podvol.VolumeSpec) (map[string]string, error) {
	if !d.caps.Attach {
		return nil, nil
	}
	name := d.volumeName(spec, "")
	if d.node == nil {
		return nil, fmt.Errorf("volume %s: no Node to read status.volumesAttached from", d.desc(name))
	}
	node, err := d.node()
	if err != nil {
		return nil, fmt.Errorf("volume %s: reading the Node: %w: %w", d.desc(name), err, volume.ErrNotReady)
	}
	for _, av := range node.Status.VolumesAttached {
		if string(av.Name) == string(spec.Name) {
			return d.waitForAttach(ctx, spec, av.DevicePath)
		}
	}
	return nil, fmt.Errorf("volume %s: %w: %w", d.desc(name), volume.Cause(errNotAttached), volume.ErrNotReady)
}

// Attach implements volume.SelfAttacher: `attach {json} {node}`, then
// waitforattach. A driver that does not support attach gets the kubelet's
// default (no device path).
func (d *driver) Attach(ctx context.Context, spec *podvol.VolumeSpec) (map[string]string, error) {
	if !d.caps.Attach {
		return nil, nil
	}
	name := d.volumeName(spec, "")
	opts, err := d.specOptions(spec, name)
	if err != nil {
		return nil, err
	}
	r, err := d.run(ctx, call{cmdAttach, []string{opts, d.nodeName}})
	devicePath := ""
	switch {
	case errors.Is(err, errNotSupported):
	case err != nil:
		return nil, fmt.Errorf("attaching volume %s to node %s: %w", d.desc(name), d.nodeName, volume.Cause(err))
	default:
		devicePath = r.DevicePath
	}
	return d.waitForAttach(ctx, spec, devicePath)
}

// waitForAttach runs `waitforattach {devicePath} {json}` within the
// kubelet's timeout.
func (d *driver) waitForAttach(ctx context.Context, spec *podvol.VolumeSpec, devicePath string) (map[string]string, error) {
	name := d.volumeName(spec, "")
	opts, err := d.specOptions(spec, name)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, d.waitTimeout)
	defer cancel()
	r, err := d.run(ctx, call{cmdWaitForAttach, []string{devicePath, opts}})
	switch {
	case errors.Is(err, errNotSupported):
	case err != nil:
		return nil, fmt.Errorf("waiting for volume %s to attach (device %q): %w", d.desc(name), devicePath, volume.Cause(err))
	default:
		devicePath = r.DevicePath
	}
	return map[string]string{publishDevicePath: devicePath}, nil
}

// specOptions are the JSON options of a call about the volume of spec
// (named name) with no pod: attach and waitforattach.
func (d *driver) specOptions(spec *podvol.VolumeSpec, name string) (string, error) {
	s, err := sourceOf(spec, name, false)
	if err != nil {
		return "", err
	}
	return s.json(nil)
}

// Detach implements volume.SelfAttacher: `detach {volume} {node}`; a
// driver that does not support it has nothing to detach.
func (d *driver) Detach(ctx context.Context, spec *podvol.VolumeSpec) error {
	if !d.caps.Attach {
		return nil
	}
	name := d.volumeName(spec, "")
	_, err := d.run(ctx, call{cmdDetach, []string{name, d.nodeName}})
	if err != nil && !errors.Is(err, errNotSupported) {
		return fmt.Errorf("detaching volume %s from node %s: %w", d.desc(name), d.nodeName, volume.Cause(err))
	}
	return nil
}

// MountDevice implements volume.DeviceMounter: `mountdevice
// {deviceMountPath} {devicePath} {json}` at
// {root}/plugins/kubernetes.io/flexvolume/{driver}/mounts/{name}, which it
// returns; a path already a mount point needs no call. A driver that does
// not support it gets the kubelet's default: the device, if there is one,
// formatted if blank and mounted there.
func (d *driver) MountDevice(ctx context.Context, req volume.DeviceRequest) (string, error) {
	name := d.volumeName(req.Spec, req.Pod.SpecName)
	fail := func(err error) (string, error) {
		return "", fmt.Errorf("staging volume %s: %w", d.desc(name), err)
	}
	s, err := sourceOf(req.Spec, name, req.Pod.ReadOnly)
	if err != nil {
		return fail(err)
	}
	if err := d.getVolumeName(ctx, s); err != nil {
		return fail(volume.Cause(err))
	}
	dmp, err := d.deviceMountPath(name)
	if err != nil {
		return fail(err)
	}
	if mounted, err := d.prepareForMount(dmp); err != nil {
		return fail(err)
	} else if mounted {
		return dmp, nil
	}
	devicePath := req.PublishContext[publishDevicePath]
	opts, err := s.json(nil)
	if err != nil {
		return fail(err)
	}
	_, err = d.run(ctx, call{cmdMountDevice, []string{dmp, devicePath, opts}})
	switch {
	case errors.Is(err, errNotSupported):
		if devicePath == "" {
			return dmp, nil
		}
		mode := "rw"
		if s.readOnly {
			mode = "ro"
		}
		if err := d.formatter.FormatAndMount(devicePath, dmp, s.fsType, []string{mode}); err != nil {
			return fail(fmt.Errorf("%w: %w", volume.Cause(err), volume.ErrInProgress))
		}
	case ctx.Err() != nil:
		return fail(fmt.Errorf("%w: %w", volume.Cause(err), volume.ErrInProgress))
	case err != nil:
		return fail(volume.Cause(err))
	}
	return dmp, nil
}

// UnmountDevice implements volume.DeviceMounter: `unmountdevice
// {deviceMountPath}` while it is a mount point (the kubelet's default, an
// unmount, for a driver that does not support it), then the directory is
// removed. It is refused (volume.InUseError) while a mount under
// {root}/pods references the device mount. A failed unmount wraps
// volume.ErrInProgress.
func (d *driver) UnmountDevice(ctx context.Context, req volume.DeviceRequest) error {
	name := d.volumeName(req.Spec, "")
	fail := func(err error) error {
		return fmt.Errorf("unstaging volume %s: %w", d.desc(name), err)
	}
	dmp, err := d.deviceMountPath(name)
	if err != nil {
		return fail(err)
	}
	if _, err := d.rfs.Lstat(dmp); errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fail(err)
	}
	mounted, err := d.mounter.IsMountPoint(dmp)
	if err != nil {
		return fail(fmt.Errorf("checking whether %s is a mount point: %w: %w", dmp, err, volume.ErrInProgress))
	}
	if mounted {
		refs, err := d.podRefs(dmp)
		if err != nil {
			return fail(err)
		}
		if len(refs) > 0 {
			return fail(&volume.InUseError{Path: dmp, Refs: refs})
		}
		_, err = d.run(ctx, call{cmdUnmountDevice, []string{dmp}})
		if errors.Is(err, errNotSupported) {
			err = blockdev.CleanupMountPoint(d.rfs, d.mounter, dmp)
		} else if err != nil {
			err = volume.Cause(err)
		}
		if err != nil {
			return fail(fmt.Errorf("%w: %w", err, volume.ErrInProgress))
		}
	}
	if err := d.removeDir(dmp); err != nil {
		return fail(err)
	}
	klog.FromContext(ctx).V(4).Info("FlexVolume unstaged", "volume", name, "driver", d.name, "path", dmp)
	return nil
}

// podRefs are the mount points under {root}/pods that reference path.
func (d *driver) podRefs(path string) ([]string, error) {
	refs, err := d.mounter.GetMountRefs(path)
	if err != nil {
		return nil, fmt.Errorf("finding the mounts that reference %s: %w", path, err)
	}
	pods := filepath.Join(d.root, "pods") + string(filepath.Separator)
	var out []string
	for _, r := range refs {
		if strings.HasPrefix(r, pods) {
			out = append(out, r)
		}
	}
	return out, nil
}

// VolumeStats implements volume.StatsProvider for a driver whose init says
// supportsMetrics: statfs of the pod's directory of the volume, as the
// kubelet's MetricsStatFS. ok is false for other drivers.
func (d *driver) VolumeStats(_ context.Context, spec *podvol.VolumeSpec, volumePath, _ string) (volume.Stats, bool, error) {
	none := volume.Stats{CapacityBytes: -1, AvailableBytes: -1, UsedBytes: -1, Inodes: -1, InodesFree: -1, InodesUsed: -1}
	if !d.caps.SupportsMetrics {
		return none, false, nil
	}
	f, err := d.rfs.OpenDir(volumePath)
	if err != nil {
		return none, false, fmt.Errorf("stats of volume %s: %w", d.desc(d.volumeName(spec, "")), err)
	}
	defer f.Close()
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		return none, false, fmt.Errorf("stats of volume %s: statfs %s: %w", d.desc(d.volumeName(spec, "")), volumePath, err)
	}
	bs := st.Bsize
	return volume.Stats{
		CapacityBytes: int64(st.Blocks) * bs, AvailableBytes: int64(st.Bavail) * bs, UsedBytes: int64(st.Blocks-st.Bfree) * bs,
		Inodes: int64(st.Files), InodesFree: int64(st.Ffree), InodesUsed: int64(st.Files - st.Ffree),
	}, true, nil
}
