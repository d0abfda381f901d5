package csiplugin

// Raw block volumes, in the kubelet's layout (csi_block.go; ondisk.BlockVolumePaths).
//
// Stage (SetUpDevice) -> publish (MapPodDevice) -> map; unmap -> unpublish
// (UnmapPodDevice) -> unstage (TearDownDevice) and removal of what is left.
// Each runs on the plugin its entry point (MountDevice, SetUp, TearDown,
// UnmountDevice) holds the root for (withRootHeld): its paths, records and the
// default mapper's are all resolved from that one handle.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"

	"k8s.io/apimachinery/pkg/types"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/internal/blockdev"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// blockPaths returns a block volume's spec name, the kubelet's (its PV's
// name: block volumes always come from a PV), and its paths for pod uid
// (none for "").
func (p *plugin) blockPaths(spec *podvol.VolumeSpec, uid types.UID) (string, ondisk.BlockPaths, error) {
	if spec.PVName == "" {
		return "", ondisk.BlockPaths{}, errors.New("a raw block volume needs a PersistentVolume")
	}
	paths, err := ondisk.BlockVolumePaths(p.root, spec.PVName, uid)
	return spec.PVName, paths, err
}

// setUpDevice stages a block volume (NodeStageVolume with block access) at
// its staging path, after writing vol_data.json; nothing is staged for a
// driver without STAGE_UNSTAGE_VOLUME.
func (p *plugin) setUpDevice(ctx context.Context, req volume.DeviceRequest) (string, error) {
	spec := req.Spec
	fail := func(err error) (string, error) {
		return "", fmt.Errorf("staging block volume %s: %w", volumeDesc(spec), err)
	}
	_, paths, err := p.blockPaths(spec, "")
	if err != nil {
		return fail(err)
	}
	client, err := p.drivers.Client(spec.Driver)
	if err != nil {
		return fail(err)
	}
	if err := p.saveBlockData(paths, spec); err != nil {
		return fail(err)
	}
	if !client.Capabilities().StageUnstage {
		return "", nil
	}
	secrets, err := p.secretData(ctx, spec.NodeStageSecret, "NodeStage", blockStageSecretWords)
	if err != nil {
		return fail(err)
	}
	if err := p.rfs.MkdirAll(paths.StagingPath, 0o750); err != nil {
		return fail(err)
	}
	rec := volumeRecord(spec, paths.StagingPath, req.PublishContext, client.Capabilities())
	rec.Phase = ondisk.PhaseStaging
	if err := p.records.Write(ctx, rec); err != nil {
		return fail(err)
	}
	err = client.Bound(p.timeout, p.steps).NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{
		VolumeId:          spec.VolumeHandle,
		PublishContext:    req.PublishContext,
		StagingTargetPath: paths.StagingPath,
		VolumeCapability:  volumeCapability(spec, client.Capabilities(), nil),
		Secrets:           secrets,
		VolumeContext:     spec.Attributes,
	})
	if err != nil {
		if !volume.IsUncertain(err) {
			// Only if the driver left it empty; the record goes with it.
			if p.rfs.Remove(paths.StagingPath) == nil {
				_ = p.records.Remove(paths.StagingPath)
			}
		}
		return "", fmt.Errorf("staging block volume %s at %s: %w", volumeDesc(spec), paths.StagingPath, err)
	}
	p.records.Update(ctx, rec, ondisk.PhaseStaged)
	klog.FromContext(ctx).V(4).Info("Block volume staged", "volume", spec.Name, "driver", spec.Driver, "stagingPath", paths.StagingPath)
	return paths.StagingPath, nil
}

func (p *plugin) saveBlockData(paths ondisk.BlockPaths, spec *podvol.VolumeSpec) error {
	if err := p.rfs.MkdirAll(paths.DataDir, 0o750); err != nil {
		return err
	}
	return ondisk.WriteVolumeData(p.rfs, paths.DataDir, &ondisk.VolumeData{
		SpecVolID:           spec.PVName,
		VolumeHandle:        spec.VolumeHandle,
		DriverName:          spec.Driver,
		NodeName:            p.node,
		AttachmentID:        AttachmentName(spec.VolumeHandle, spec.Driver, p.node),
		VolumeLifecycleMode: "Persistent",
	})
}

// tearDownDevice unstages a block volume (NodeUnstageVolume, when it was
// staged) and removes what is left of it: the staging path, the publish
// directory, dev/ and data/ and the volume's directory, each only when
// empty and not a mount point. Nothing nodevol did not create is removed.
//
// It refuses (an *volume.InUseError naming the publish paths) while a publish
// of the volume may remain, as UnmountDevice refuses while mounts
// reference a staging path: most drivers would unstage under the publish,
// a strict one refuses, and vol_data.json, which tells whose the publish
// is, must stay.
func (p *plugin) tearDownDevice(ctx context.Context, req volume.DeviceRequest) error {
	spec := req.Spec
	fail := func(err error) error {
		return fmt.Errorf("unstaging block volume %s: %w", volumeDesc(spec), err)
	}
	_, paths, err := p.blockPaths(spec, "")
	if err != nil {
		return fail(err)
	}
	if err := p.checkBlockPublishes(paths); err != nil {
		return fail(err)
	}
	if _, err := p.rfs.Stat(paths.StagingPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fail(err)
	} else if err == nil {
		client, err := p.drivers.Client(spec.Driver)
		if err != nil {
			return fail(err)
		}
		if client.Capabilities().StageUnstage {
			p.records.Update(ctx, volumeRecord(spec, paths.StagingPath, req.PublishContext, client.Capabilities()), ondisk.PhaseUnstaging)
			err := client.Bound(p.timeout, p.steps).NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{
				VolumeId:          spec.VolumeHandle,
				StagingTargetPath: paths.StagingPath,
			})
			if err != nil {
				return fmt.Errorf("unstaging block volume %s from %s: %w", volumeDesc(spec), paths.StagingPath,
					kubeletWords("kubernetes.io/csi: blockMapper.unstageVolumeForBlock failed: ", err))
			}
		}
	}
	for _, dir := range []string{paths.StagingPath, paths.PublishDir, paths.GlobalMapPath} {
		if err := p.removeEmptyDir(dir); err != nil {
			return fail(volume.AtStep(volume.StepRemoveMapPath, err))
		}
	}
	for _, f := range []string{filepath.Join(paths.DataDir, ondisk.VolumeDataFile), paths.DataDir, paths.Dir} {
		if err := p.rfs.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fail(err)
		}
	}
	if err := p.records.Remove(paths.StagingPath); err != nil {
		return fail(err)
	}
	klog.FromContext(ctx).V(4).Info("Block volume unstaged", "volume", spec.Name, "driver", spec.Driver, "stagingPath", paths.StagingPath)
	return nil
}

// checkBlockPublishes returns an *volume.InUseError when a publish of a block
// volume may remain: an entry in its publish directory (what a driver
// publishes at) or a record of a publish of it (a NodePublishVolume or
// NodeUnpublishVolume was sent). The loop keeps the paths as the volume's
// Refs, which the planner waits on until the resync looks again.
func (p *plugin) checkBlockPublishes(paths ondisk.BlockPaths) error {
	left := map[string]bool{}
	entries, err := p.rfs.ReadDir(paths.PublishDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("listing the publishes in %s: %w", paths.PublishDir, err)
	}
	for _, e := range entries {
		left[filepath.Join(paths.PublishDir, e.Name())] = true
	}
	recorded, err := p.records.PublishedIn(paths.PublishDir)
	if err != nil {
		return err
	}
	for _, rel := range recorded {
		left[filepath.Join(p.root, rel)] = true
	}
	if len(left) == 0 {
		return nil
	}
	refs := make([]string, 0, len(left))
	for path := range left {
		refs = append(refs, path)
	}
	sort.Strings(refs)
	return fmt.Errorf("still published: %w", &volume.InUseError{Path: paths.StagingPath, Refs: refs})
}

// removeEmptyDir removes dir unless it is a mount point; a directory that
// is not empty stays and is an error naming what is in it. A symlink as
// dir or above it is an error and stays.
func (p *plugin) removeEmptyDir(dir string) error {
	if _, err := p.rfs.Verify(dir); err != nil {
		return err
	}
	mnt, err := p.mounter.IsMountPoint(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("checking whether %s is a mount point: %w", dir, err)
	case mnt:
		return fmt.Errorf("%s is still a mount point", dir)
	}
	if err := p.rfs.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		entries, _ := p.rfs.ReadDir(dir)
		names := make([]string, 0, len(entries))
		for _, e := range entries {
			names = append(names, e.Name())
		}
		return fmt.Errorf("removing %s (left: %v): %w", dir, names, err)
	}
	return nil
}

// podBlockMap is the map of a pod's block volume named name at paths.
func podBlockMap(name string, paths ondisk.BlockPaths, uid types.UID) volume.BlockMap {
	return volume.BlockMap{DevicePath: paths.PublishPath, GlobalMapPath: paths.GlobalMapPath, PodUID: string(uid), PodDeviceDir: paths.PodDeviceDir, Name: name}
}

// mapPodDevice publishes a block volume for a pod (NodePublishVolume with
// block access at the pod's publish path) and maps the published device
// into the pod (internal/blockdev): SetUp after the request is built. It
// returns the pod's device path. A map that fails after a successful
// publish leaves the volume Uncertain.
func (p *plugin) mapPodDevice(ctx context.Context, pub *publication) (string, error) {
	spec, vol, paths := pub.req.Spec, pub.req.Volume, pub.paths
	if err := p.saveBlockData(paths, spec); err != nil {
		return pub.fail(err)
	}
	if err := p.rfs.MkdirAll(paths.PublishDir, 0o750); err != nil {
		return pub.fail(err)
	}
	// Checked right before the driver gets the publish path, and again
	// before the mapper gets the map.
	m := podBlockMap(pub.name, paths, vol.Pod.UID)
	if err := m.Verify(p.rfs); err != nil {
		return pub.fail(err)
	}
	if err := p.records.Write(ctx, pub.rec); err != nil {
		return pub.fail(err)
	}
	if err := pub.client.Bound(p.timeout, p.steps).NodePublishVolume(ctx, pub.call); err != nil {
		if !volume.IsUncertain(err) {
			if _, serr := p.rfs.Lstat(paths.PublishPath); errors.Is(serr, fs.ErrNotExist) {
				_ = p.records.Remove(paths.PublishPath) // nothing published
			}
		}
		return "", fmt.Errorf("publishing block volume %s for pod %s at %s: %w", pub.desc, vol.Pod, paths.PublishPath, err)
	}
	err := m.Verify(p.rfs)
	if err == nil {
		err = p.blockMapper.Map(ctx, m)
	}
	if err != nil {
		// Published but not mapped: Uncertain, so that it is mapped again or
		// unpublished, never forgotten.
		return "", volume.AtStep(volume.StepMapBlockVolume,
			fmt.Errorf("mapping block volume %s of driver %s into pod %s: %w: %w", pub.desc, spec.Driver, vol.Pod, volume.Cause(err), volume.ErrInProgress))
	}
	p.records.Update(ctx, pub.rec, ondisk.PhasePublished)
	klog.FromContext(ctx).V(4).Info("Block volume mapped", "pod", klog.KRef(vol.Pod.Namespace, vol.Pod.Name), "volume", spec.Name, "devicePath", paths.PodDevicePath)
	return paths.PodDevicePath, nil
}

// unmapPodDevice unmaps a block volume from a pod and unpublishes it
// (NodeUnpublishVolume). Each step is idempotent, so that a run cut short
// anywhere (the symlink and the map file gone, the publish still there) is
// finished by the next: it unpublishes while the publish path exists or a
// record says a publish or an unpublish was sent (the driver may hold a
// publish whose target it has not created, as NodeUnpublishVolume after a
// timed-out NodePublishVolume in the kubelet). With nothing of the pod's
// left on disk it does nothing, driver registered or not.
func (p *plugin) unmapPodDevice(ctx context.Context, req volume.MountRequest) error {
	spec, vol := req.Spec, req.Volume
	fail := func(err error) error {
		return fmt.Errorf("unpublishing block volume %s from pod %s: %w", volumeDesc(spec), vol.Pod, err)
	}
	name, paths, err := p.blockPaths(spec, vol.Pod.UID)
	if err != nil {
		return fail(err)
	}
	m := podBlockMap(name, paths, vol.Pod.UID)
	if err := m.Verify(p.rfs); err != nil {
		return fail(err)
	}
	if err := p.blockMapper.Unmap(ctx, m); err != nil {
		return fail(volume.AtStep(volume.StepUnmapBlockVolume, volume.Cause(err)))
	}
	if left, err := p.publishLeft(paths.PublishPath); err != nil {
		return fail(err)
	} else if !left {
		return nil
	}
	client, err := p.drivers.Client(spec.Driver)
	if err != nil {
		return fail(err)
	}
	if _, err := p.rfs.Verify(paths.PublishPath); err != nil {
		return fail(err)
	}
	p.records.Update(ctx, p.podRecord(spec, vol, paths.PublishPath, req.PublishContext, client.Capabilities(), spec.NodePublishSecret), ondisk.PhaseUnpublishing)
	if err := client.Bound(p.timeout, p.steps).NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{
		VolumeId:   spec.VolumeHandle,
		TargetPath: paths.PublishPath,
	}); err != nil {
		return fmt.Errorf("unpublishing block volume %s from pod %s at %s: %w", volumeDesc(spec), vol.Pod, paths.PublishPath,
			kubeletWords("kubernetes.io/csi: blockMapper.unpublishVolumeForBlock failed: ", err))
	}
	// The driver removes the publish path (CSI spec); a driver that did not
	// leaves a file nodevol can remove once nothing is mounted on it.
	if err := blockdev.CleanupMountPoint(p.rfs, p.mounter, paths.PublishPath); err != nil {
		return fail(err)
	}
	if err := p.records.Remove(paths.PublishPath); err != nil {
		return fail(err)
	}
	klog.FromContext(ctx).V(4).Info("Block volume unmapped", "pod", klog.KRef(vol.Pod.Namespace, vol.Pod.Name), "volume", spec.Name)
	return nil
}

// publishLeft tells whether a pod's block publish at publishPath may
// remain: the path exists, or a record says a publish was sent. When none
// may (never published, or unpublished already: the driver removes the
// publish path), its record goes.
func (p *plugin) publishLeft(publishPath string) (bool, error) {
	_, err := p.rfs.Stat(publishPath)
	if !errors.Is(err, fs.ErrNotExist) {
		return err == nil, err
	}
	rel, err := p.rfs.Rel(publishPath)
	if err != nil {
		return false, err
	}
	if rec, err := ondisk.ReadRecord(p.rfs, rel); err == nil && rec.Phase != ondisk.PhaseUnpublishing {
		return true, nil
	}
	return false, p.records.Remove(publishPath)
}
