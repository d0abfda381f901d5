package local

// Raw block volumes, as the kubelet maps a local PV's device
// (operation_generator's MapVolume with util.MapBlockVolume): the local
// plugin stages nothing and publishes the PV's device itself, which the
// generic path bind-mounts to
// {root}/plugins/kubernetes.io~local-volume/volumeDevices/{pv}/{uid}, holds
// open with a loop device attached to that file, and symlinks at
// {root}/pods/{uid}/volumeDevices/kubernetes.io~local-volume/{pv}.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/volume"
)

// blockMap returns the map of PV pv's device dev for pod uid.
func (p *plugin) blockMap(pv string, uid types.UID, dev string) (volume.BlockMap, error) {
	dir, err := p.podDeviceDir(uid)
	if err != nil {
		return volume.BlockMap{}, err
	}
	return volume.BlockMap{DevicePath: dev, GlobalMapPath: filepath.Join(p.globalMapBase(), pv), PodUID: string(uid), PodDeviceDir: dir, Name: pv}, nil
}

// mapDevice maps a Block volume's device into the pod and returns the
// pod's symlink to it. The directories and the map file are made here,
// through the root (each a step); the bind mount, the loop device and the
// symlink by the BlockMapper. A map that failed may have left part of it:
// the error wraps volume.ErrInProgress, so that it is mapped again or
// unmapped.
func (p *plugin) mapDevice(ctx context.Context, req volume.MountRequest) (string, error) {
	spec, vol := req.Spec, req.Volume
	fail := func(err error) (string, error) {
		// The kubelet's local plugin maps nothing of its own: its events
		// name the common map.
		return "", volume.AtStep(volume.StepMapBlockVolume, fmt.Errorf("mapping block volume %s into pod %s: %w", desc(spec), vol.Pod, err))
	}
	pv, err := pvName(spec)
	if err != nil {
		return fail(err)
	}
	src, kind, err := p.source(spec)
	if err != nil {
		return fail(err)
	}
	if kind != kindBlockDevice {
		return fail(fmt.Errorf("local path %s is a directory: a PV of volumeMode Block needs a block device", src))
	}
	// As the kubelet, the pod's symlink points to the device itself, not
	// to a link to it (/dev/disk/by-id/...).
	dev, err := filepath.EvalSymlinks(src)
	if err != nil {
		return fail(fmt.Errorf("resolving %s: %w", src, err))
	}
	m, err := p.blockMap(pv, vol.Pod.UID, dev)
	if err != nil {
		return fail(err)
	}
	if err := m.Verify(p.rfs); err != nil {
		return fail(err)
	}
	for _, dir := range []string{m.GlobalMapPath, m.PodDeviceDir} {
		if err := p.rfs.MkdirAll(dir, 0o750); err != nil {
			return fail(err)
		}
	}
	if err := p.rfs.Create(filepath.Join(m.GlobalMapPath, m.PodUID), 0o640); err != nil && !errors.Is(err, fs.ErrExist) {
		return fail(err)
	}
	if err := m.Verify(p.rfs); err != nil {
		return fail(fmt.Errorf("%w: %w", err, volume.ErrInProgress))
	}
	if err := p.blockMapper.Map(ctx, m); err != nil {
		return fail(fmt.Errorf("%w: %w", volume.Cause(err), volume.ErrInProgress))
	}
	link := filepath.Join(m.PodDeviceDir, m.Name)
	klog.FromContext(ctx).V(4).Info("Local block volume mapped", "pod", klog.KRef(vol.Pod.Namespace, vol.Pod.Name), "volume", spec.Name, "device", dev, "path", link)
	return link, nil
}

// unmapDevice unmaps a Block volume from the pod: the symlink (only if it
// is one; the device it names is the one unmapped), then the loop device,
// the bind mount and the map file (the BlockMapper). It needs only the
// spec's PVName and the pod's UID. Idempotent. A failure may leave part
// of the map: the error wraps volume.ErrInProgress.
func (p *plugin) unmapDevice(ctx context.Context, req volume.MountRequest) error {
	spec, vol := req.Spec, req.Volume
	fail := func(err error) error {
		return volume.AtStep(volume.StepUnmapBlockVolume, fmt.Errorf("unmapping block volume %s from pod %s: %w", desc(spec), vol.Pod, err))
	}
	pv, err := pvName(spec)
	if err != nil {
		return fail(err)
	}
	m, err := p.blockMap(pv, vol.Pod.UID, "")
	if err != nil {
		return fail(err)
	}
	if err := m.Verify(p.rfs); err != nil {
		return fail(err)
	}
	link := filepath.Join(m.PodDeviceDir, m.Name)
	target, err := p.rfs.Readlink(link)
	switch {
	case err == nil:
		// Removed here, through the root (a step); the mapper then finds
		// no symlink, and a restart finds the map file without one.
		m.DevicePath = target
		if err := p.rfs.RemoveLink(link); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fail(fmt.Errorf("%w: %w", err, volume.ErrInProgress))
		}
	case errors.Is(err, fs.ErrNotExist):
		m.DevicePath = "the device of PV " + pv
	default:
		return fail(fmt.Errorf("%s is not a symlink (%w): left as it is", link, err))
	}
	if err := p.blockMapper.Unmap(ctx, m); err != nil {
		return fail(fmt.Errorf("%w: %w", volume.Cause(err), volume.ErrInProgress))
	}
	klog.FromContext(ctx).V(4).Info("Local block volume unmapped", "pod", klog.KRef(vol.Pod.Namespace, vol.Pod.Name), "volume", spec.Name, "path", link)
	return nil
}

// removeGlobalMapDir removes a Block volume's directory of map files once
// no pod's map file is left in it, as the kubelet's UnmapDevice removes
// the global map path; while one is, it is a *volume.InUseError naming
// them.
func (p *plugin) removeGlobalMapDir(pv string) error {
	dir := filepath.Join(p.globalMapBase(), pv)
	if _, err := p.rfs.Verify(dir); err != nil {
		return err
	}
	entries, err := p.rfs.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	if len(entries) > 0 {
		refs := make([]string, 0, len(entries))
		for _, e := range entries {
			refs = append(refs, filepath.Join(dir, e.Name()))
		}
		sort.Strings(refs)
		return fmt.Errorf("pods still map it: %w", &volume.InUseError{Path: dir, Refs: refs})
	}
	if err := p.rfs.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
