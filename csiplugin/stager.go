package csiplugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/internal/rootfs"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// MountDevice implements volume.DeviceMounter: it stages the
// volume with NodeStageVolume at StagingPath and returns that path. It
// returns ("", nil) without doing anything for an inline volume. Whether
// a volume is staged at all is the planner's decision
// (Capabilities.Stages: the driver has STAGE_UNSTAGE_VOLUME): it is not
// asked to stage one that is not. Before the call it creates the staging
// directory and writes vol_data.json beside it, in the kubelet's format.
// On a final error it removes them again; on an error wrapping
// ErrInProgress it leaves them, since the driver may still stage.
// Idempotent, as NodeStageVolume is.
func (p *plugin) MountDevice(ctx context.Context, req volume.DeviceRequest) (string, error) {
	spec := req.Spec
	if spec.Ephemeral {
		return "", nil
	}
	fail := func(err error) (string, error) {
		return "", fmt.Errorf("staging volume %s: %w", volumeDesc(spec), err)
	}
	p, release, err := p.withRootHeld()
	if err != nil {
		return fail(err)
	}
	defer release()
	if spec.Mode == podvol.Block {
		return p.setUpDevice(ctx, req)
	}
	// A volume an older kubelet staged in its legacy directory is staged
	// there again (idempotently), not a second time elsewhere.
	dir, legacy, err := ondisk.FindStagingDir(p.rfs, p.root, spec.PVName, spec.Driver, spec.VolumeHandle)
	if err != nil {
		return fail(err)
	}
	client, err := p.drivers.Client(spec.Driver)
	if err != nil {
		return fail(err)
	}
	driver, err := p.csiDriver(spec.Driver) // its fsGroupPolicy
	if err != nil {
		return fail(err)
	}
	secrets, err := p.secretData(ctx, spec.NodeStageSecret, "NodeStage", stageSecretWords)
	if err != nil {
		return fail(err)
	}
	stagingPath := filepath.Join(dir, ondisk.StagingLeaf)
	sd, made, err := p.makeStagingDir(dir)
	if err != nil {
		return fail(err)
	}
	defer sd.Close()
	// specVolID (the PV's name) is more than the kubelet writes here; it
	// lets a restart tell which unreadable pod directory may use the device.
	// A legacy directory's vol_data.json is read, never written: it already
	// names this volume.
	if !legacy {
		err = ondisk.WriteVolumeDataIn(sd, made, &ondisk.VolumeData{SpecVolID: spec.PVName, VolumeHandle: spec.VolumeHandle, DriverName: spec.Driver,
			SELinuxMountContext: req.SELinuxContext})
	}
	rec := volumeRecord(spec, dir, req.PublishContext, client.Capabilities())
	if err == nil {
		rec.Phase = ondisk.PhaseStaging
		err = p.records.Write(ctx, rec)
	}
	if err == nil && !made {
		// Checked again right before the driver gets the path: in a
		// directory this call has just made, nothing can be there but
		// the directory it made.
		_, err = sd.Verify(ondisk.StagingLeaf)
	}
	if err == nil {
		err = client.Bound(p.timeout, p.steps).NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{
			VolumeId:          spec.VolumeHandle,
			PublishContext:    req.PublishContext,
			StagingTargetPath: stagingPath,
			VolumeCapability:  withSELinuxContext(volumeCapability(spec, client.Capabilities(), mountGroup(client.Capabilities(), driver, req.Pod.FSGroup)), req.SELinuxContext),
			Secrets:           secrets,
			VolumeContext:     spec.Attributes,
		})
	}
	if err != nil {
		p.undoStage(klog.FromContext(ctx).WithValues("volume", spec.Name, "driver", spec.Driver), dir, legacy, err)
		return "", fmt.Errorf("staging volume %s at %s: %w", volumeDesc(spec), stagingPath, err)
	}
	p.records.Update(ctx, rec, ondisk.PhaseStaged)
	if logger := klog.FromContext(ctx).V(4); logger.Enabled() { // its arguments cost allocations even when the line is dropped
		logger.Info("Volume staged", "volume", spec.Name, "driver", spec.Driver, "stagingPath", stagingPath)
	}
	return stagingPath, nil
}

// stagingDepth is how many components of a staging directory (relative to
// the root) are expected to exist before a stage: the driver's directory,
// plugins/kubernetes.io/csi/{driver} (or the legacy pv).
const stagingDepth = 4

// makeStagingDir makes the staging directory dir and its globalmount, and
// returns dir held (its vol_data.json is written from it) and whether this
// call made dir: then it made globalmount too, with one mkdirat, and
// nothing else is in it. Otherwise globalmount is made if missing and
// refused if it is a symlink.
func (p *plugin) makeStagingDir(dir string) (*rootfs.Root, bool, error) {
	sd, made, err := p.rfs.MkdirAllSub(dir, 0o750, stagingDepth)
	if err != nil {
		return nil, false, err
	}
	if made {
		err = sd.Mkdir(ondisk.StagingLeaf, 0o750)
	} else {
		err = sd.MkdirAll(ondisk.StagingLeaf, 0o750)
	}
	if err != nil {
		sd.Close()
		return nil, false, err
	}
	return sd, made, nil
}

// undoStage removes what a stage that failed with err created, unless the
// driver may still stage: the staging directory and its record, or only
// the record in an older kubelet's directory, which is not nodevol's.
// Failures are logged.
func (p *plugin) undoStage(logger klog.Logger, dir string, legacy bool, err error) {
	switch {
	case volume.IsUncertain(err):
	case legacy:
		if cerr := p.records.Remove(dir); cerr != nil {
			logger.Error(cerr, "Cleaning up after a failed NodeStageVolume")
		}
	default:
		if cerr := p.removeVolumeDir(dir, ondisk.StagingLeaf); cerr != nil {
			logger.Error(cerr, "Cleaning up after a failed NodeStageVolume")
		} else if cerr := p.records.Remove(dir); cerr != nil {
			logger.Error(cerr, "Cleaning up after a failed NodeStageVolume")
		}
	}
}

// UnmountDevice implements volume.DeviceMounter: it unstages
// the volume with NodeUnstageVolume (when the driver stages volumes) and
// removes the staging path, vol_data.json and their directory. A volume
// whose staging directory does not exist is not staged: nothing to do,
// whether or not its driver is registered. The staging path is removed
// only when it is no longer a mount point.
//
// It refuses (an *volume.InUseError) while any mount under {root}/pods
// references the staged device, as the kubelet's UnmountDevice refuses
// while GetDeviceMountRefs finds one: a pod that nodevol does not know of
// (its vol_data.json unreadable, say) may still have it published, and
// most drivers would unstage under it.
func (p *plugin) UnmountDevice(ctx context.Context, req volume.DeviceRequest) error {
	spec := req.Spec
	if spec.Ephemeral {
		return nil
	}
	p, release, err := p.withRootHeld()
	if err != nil {
		return fmt.Errorf("unstaging volume %s: %w", volumeDesc(spec), err)
	}
	defer release()
	if spec.Mode == podvol.Block {
		return p.tearDownDevice(ctx, req)
	}
	// A volume staged by an older kubelet is unstaged from its legacy
	// directory, which is then removed as nodevol's own would be.
	dir, _, err := ondisk.FindStagingDir(p.rfs, p.root, spec.PVName, spec.Driver, spec.VolumeHandle)
	if err != nil {
		return fmt.Errorf("unstaging volume %s: %w", volumeDesc(spec), err)
	}
	stagingPath, err := p.verifyLeaf(dir, ondisk.StagingLeaf)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("unstaging volume %s: %w", volumeDesc(spec), err)
	}
	client, err := p.drivers.Client(spec.Driver)
	if err != nil {
		return fmt.Errorf("unstaging volume %s: %w", volumeDesc(spec), err)
	}
	if err := p.checkMountRefs(stagingPath); err != nil {
		return fmt.Errorf("unstaging volume %s: %w", volumeDesc(spec), err)
	}
	if client.Capabilities().StageUnstage {
		p.records.Update(ctx, volumeRecord(spec, dir, req.PublishContext, client.Capabilities()), ondisk.PhaseUnstaging)
		err := client.Bound(p.timeout, p.steps).NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{
			VolumeId:          spec.VolumeHandle,
			StagingTargetPath: stagingPath,
		})
		if err != nil {
			return fmt.Errorf("unstaging volume %s from %s: %w", volumeDesc(spec), stagingPath, kubeletWords("kubernetes.io/csi: attacher.UnmountDevice failed: ", err))
		}
	}
	if err := p.removeVolumeDir(dir, ondisk.StagingLeaf); err != nil {
		return fmt.Errorf("unstaging volume %s: %w", volumeDesc(spec), err)
	}
	if err := p.records.Remove(dir); err != nil {
		return fmt.Errorf("unstaging volume %s: %w", volumeDesc(spec), err)
	}
	if logger := klog.FromContext(ctx).V(4); logger.Enabled() {
		logger.Info("Volume unstaged", "volume", spec.Name, "driver", spec.Driver, "stagingPath", stagingPath)
	}
	return nil
}

// checkMountRefs returns an *volume.InUseError when mounts under the pods
// directory reference the device mounted at stagingPath.
func (p *plugin) checkMountRefs(stagingPath string) error {
	refs, err := p.mounter.GetMountRefs(stagingPath)
	if err != nil {
		return fmt.Errorf("finding the mounts that reference %s: %w", stagingPath, err)
	}
	pods := filepath.Join(p.root, "pods") + string(filepath.Separator)
	var inPods []string
	for _, r := range refs {
		if strings.HasPrefix(r, pods) {
			inPods = append(inPods, r)
		}
	}
	if len(inPods) > 0 {
		return &volume.InUseError{Path: stagingPath, Refs: inPods}
	}
	return nil
}

// removeVolumeDir removes dir/leaf (a staging or publish path) unless it
// is a mount point, then dir's vol_data.json and dir itself. It never
// removes anything recursively: a directory the driver left files in stays,
// and the error says so. Missing entries are not an error. It follows no
// symlink under the root: a symlink as dir, as leaf or above them is an
// error and nothing is removed through it (dir is resolved once, right
// before the removals, and they are made relative to it).
func (p *plugin) removeVolumeDir(dir, leaf string) error {
	path, err := p.rfs.Verify(filepath.Join(dir, leaf))
	if err != nil {
		return err
	}
	mnt, err := p.mounter.IsMountPoint(path)
	switch {
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("checking whether %s is a mount point: %w", path, err)
	case err == nil && mnt:
		return fmt.Errorf("%s is still a mount point", path)
	}
	return p.rfs.RemoveIn(dir, leaf, ondisk.VolumeDataFile)
}
