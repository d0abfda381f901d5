package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/internal/fsgroup"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// reasonAlreadyMounted is the kubelet's event reason for a volume another
// pod mounted with another fsGroup.
const reasonAlreadyMounted = "AlreadyMountedVolume"

// SetUp implements volume.Mounter. A Filesystem volume is bind-mounted
// (options bind, ro when read-only, then the PV's mountOptions) from the
// PV's directory, or from the device mount of its block device, at
// {root}/pods/{uid}/volumes/kubernetes.io~local-volume/{pv}, which it
// returns. A Block volume is mapped (see mapDevice). Idempotent: a mount
// already there is kept.
//
// With req.ChangeOwnership, the pod's fsGroup gets ownership of the files
// unless another pod has the volume mounted already; then, as the
// kubelet, it only warns when the volume's group is another one. A mount
// that failed and may remain, or an ownership change that failed after the
// mount, is an error wrapping volume.ErrInProgress.
func (p *plugin) SetUp(ctx context.Context, req volume.MountRequest) (string, error) {
	spec, vol := req.Spec, req.Volume
	if spec.Mode == podvol.Block {
		return p.mapDevice(ctx, req)
	}
	fail := func(err error) (string, error) {
		return "", fmt.Errorf("mounting volume %s for pod %s: %w", desc(spec), vol.Pod, err)
	}
	pv, err := pvName(spec)
	if err != nil {
		return fail(err)
	}
	dir, err := p.podVolumePath(vol.Pod.UID, pv)
	if err != nil {
		return fail(err)
	}
	src, err := p.mountSource(spec, pv)
	if err != nil {
		return fail(err)
	}
	if _, err := p.rfs.Verify(dir); err != nil {
		return fail(err)
	}
	refs, err := p.podRefs(src, dir)
	if err != nil {
		return fail(err)
	}
	readOnly := vol.ReadOnly || spec.ReadOnly
	mounted, err := p.mounter.IsMountPoint(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fail(fmt.Errorf("checking whether %s is a mount point: %w", dir, err))
	}
	if !mounted {
		if vol.FSGroup != nil && len(refs) > 0 {
			p.warnOtherGroup(ctx, spec, vol, src, refs)
		}
		if err := p.bindMount(src, dir, spec, readOnly); err != nil {
			return fail(err)
		}
	}
	// As the kubelet, the group is given once, by the first pod to mount
	// the volume; a SetUp repeated on a mount left Uncertain gives it again.
	if req.ChangeOwnership && vol.FSGroup != nil && !readOnly && len(refs) == 0 {
		d, err := p.rfs.OpenDir(dir)
		if err == nil {
			err = p.ownership.Change(ctx, fsgroup.Request{
				Dir: d, GID: *vol.FSGroup, OnRootMismatch: vol.FSGroupOnRootMismatch,
				Pod:    v1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: vol.Pod.Namespace, Name: vol.Pod.Name, UID: vol.Pod.UID},
				Volume: vol.SpecName,
			})
			d.Close()
		}
		if err != nil {
			return fail(fmt.Errorf("giving fsGroup %d ownership of %s: %w: %w", *vol.FSGroup, dir, err, volume.ErrInProgress))
		}
	}
	klog.FromContext(ctx).V(4).Info("Local volume mounted", "pod", klog.KRef(vol.Pod.Namespace, vol.Pod.Name), "volume", spec.Name, "source", src, "path", dir)
	return dir, nil
}

// mountSource is what a Filesystem volume's pods bind-mount: the PV's
// directory, or the device mount of its block device, which must be
// mounted (MountDevice) so that a pod never writes into the empty
// directory below it.
func (p *plugin) mountSource(spec *podvol.VolumeSpec, pv string) (string, error) {
	path, kind, err := p.source(spec)
	if err != nil {
		return "", err
	}
	if kind == kindDirectory {
		return path, nil
	}
	dmp := p.deviceMountPath(pv)
	if _, err := p.rfs.Verify(dmp); err != nil {
		return "", err
	}
	mounted, err := p.mounter.IsMountPoint(dmp)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("checking whether %s is a mount point: %w", dmp, err)
	}
	if !mounted {
		return "", fmt.Errorf("block device %s is not mounted at %s yet: %w", path, dmp, volume.ErrNotReady)
	}
	return dmp, nil
}

// bindMount bind-mounts src at dir, creating dir. On a failure it takes
// back what it made, as the kubelet does: a mount that may remain is an
// error wrapping volume.ErrInProgress; otherwise dir is removed.
func (p *plugin) bindMount(src, dir string, spec *podvol.VolumeSpec, readOnly bool) error {
	if err := p.rfs.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	opts := []string{"bind"}
	if readOnly {
		opts = append(opts, "ro")
	}
	opts = append(opts, spec.MountOptions...)
	if _, err := p.rfs.Verify(dir); err != nil {
		return err
	}
	err := p.mounter.MountSensitiveWithoutSystemd(src, dir, "", opts, nil)
	if err == nil {
		return nil
	}
	// The mounter's error is the kubelet's words: it returns it as it is.
	err = fmt.Errorf("bind-mounting %s at %s (options %v): %w", src, dir, opts, volume.Cause(err))
	if cerr := p.unmountAndRemove(dir); cerr != nil {
		return fmt.Errorf("%w; cleaning up: %w: %w", err, cerr, volume.ErrInProgress)
	}
	return err
}

// warnOtherGroup tells, as the kubelet does, that a volume other pods have
// mounted has another group than the pod's fsGroup: it may not be
// shareable. It does not refuse the mount.
func (p *plugin) warnOtherGroup(ctx context.Context, spec *podvol.VolumeSpec, vol podvol.PodVolume, src string, refs []string) {
	fi, err := os.Stat(src)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Cannot read the group of a local volume other pods have mounted", "volume", spec.Name, "path", src)
		return
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || int64(st.Gid) == *vol.FSGroup {
		return
	}
	msg := fmt.Sprintf("The requested fsGroup is %d, but the volume %s has GID %d. The volume may not be shareable.", *vol.FSGroup, spec.PVName, st.Gid)
	klog.FromContext(ctx).Info(msg, "pod", klog.KRef(vol.Pod.Namespace, vol.Pod.Name), "mountedBy", refs)
	if p.events != nil {
		p.events.Event(&v1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: vol.Pod.Namespace, Name: vol.Pod.Name, UID: vol.Pod.UID},
			v1.EventTypeWarning, reasonAlreadyMounted, msg)
	}
}

// TearDown implements volume.Mounter: it unmounts the pod's mount of the
// volume and removes its directory (never what is in it), or unmaps a
// Block volume. It needs only the spec's PVName and Mode and the pod's
// UID, so that it works on a volume found on disk. Idempotent. An unmount
// that failed is an error wrapping volume.ErrInProgress: the mount may
// remain.
func (p *plugin) TearDown(ctx context.Context, req volume.MountRequest) error {
	spec, vol := req.Spec, req.Volume
	if spec.Mode == podvol.Block {
		return p.unmapDevice(ctx, req)
	}
	fail := func(err error) error {
		return fmt.Errorf("unmounting volume %s from pod %s: %w", desc(spec), vol.Pod, err)
	}
	pv, err := pvName(spec)
	if err != nil {
		return fail(err)
	}
	dir, err := p.podVolumePath(vol.Pod.UID, pv)
	if err != nil {
		return fail(err)
	}
	if err := p.unmountAndRemove(dir); err != nil {
		return fail(err)
	}
	klog.FromContext(ctx).V(4).Info("Local volume unmounted", "pod", klog.KRef(vol.Pod.Namespace, vol.Pod.Name), "volume", spec.Name, "path", dir)
	return nil
}

// unmountAndRemove unmounts path while it is a mount point (the kubelet's
// extensive check: a bind mount of a directory of the same filesystem is
// seen) and removes it once it is an empty directory. A missing path is
// not an error; a failed unmount wraps volume.ErrInProgress.
func (p *plugin) unmountAndRemove(path string) error {
	for unmounted := false; ; unmounted = true {
		if _, err := p.rfs.Verify(path); err != nil {
			return err
		}
		mounted, err := p.mounter.IsMountPoint(path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return nil
		case err != nil:
			return fmt.Errorf("checking whether %s is a mount point: %w: %w", path, err, volume.ErrInProgress)
		case !mounted:
			if err := p.rfs.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("removing %s: %w", path, err)
			}
			return nil
		case unmounted:
			return fmt.Errorf("%s is still a mount point after it was unmounted: %w", path, volume.ErrInProgress)
		}
		if err := p.mounter.Unmount(path); err != nil {
			return fmt.Errorf("unmounting %s: %w: %w", path, err, volume.ErrInProgress)
		}
	}
}
