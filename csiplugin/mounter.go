package csiplugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/internal/fsutil"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// SetUp implements volume.Mounter: it publishes the volume with
// NodePublishVolume at PodVolumePath(root, podUID, VolumeDirName(...)) and
// returns that path (a raw block volume: mapPodDevice). Before the call it
// creates the pod's volume directory
// (the driver creates the "mount" directory in it, as the CSI spec says)
// and writes vol_data.json there, in the kubelet's format. On a final
// error it removes them again, unless req.Republish; on an error wrapping
// ErrInProgress it leaves them. Idempotent, as NodePublishVolume is. It gives the pod's
// fsGroup ownership of the published files when req.ChangeOwnership says
// so (the planner decides, from Capabilities.OwnershipChange); whether the
// driver supports the volume's lifecycle mode is the planner's check
// (Capabilities.LifecycleModes), but for an inline volume of a driver
// without a CSIDriver, which SetUp refuses (ephemeralRefusal). Every name
// from outside is checked once, as the request is built (newPublication).
func (p *plugin) SetUp(ctx context.Context, req volume.MountRequest) (string, error) {
	desc := volumeDesc(req.Spec)
	p, release, err := p.withRootHeld()
	if err != nil {
		return "", fmt.Errorf("publishing volume %s for pod %s: %w", desc, req.Volume.Pod, err)
	}
	defer release()
	pub, err := p.newPublication(ctx, req, desc)
	if err != nil {
		return "", err
	}
	if pub.block {
		return p.mapPodDevice(ctx, pub)
	}
	return p.publish(ctx, pub)
}

// publish publishes a file-system volume for a pod: SetUp after the
// request is built.
func (p *plugin) publish(ctx context.Context, pub *publication) (string, error) {
	spec, vol, dir, target := pub.req.Spec, pub.req.Volume, pub.dir, pub.call.TargetPath
	// The pod volume directory, held: made (and every directory above it
	// checked) from one handle, and vol_data.json written from it.
	vd, made, err := p.rfs.MkdirAllSub(dir, 0o750, podsDepth)
	if err != nil {
		return pub.fail(err)
	}
	defer vd.Close()
	// The driver creates "mount"; one that is there must not be a symlink,
	// nothing is written beside one, and it is checked again right before
	// the driver gets the path. In a directory this call has just made
	// there is none to check.
	if !made {
		if _, err := vd.Verify(ondisk.PublishLeaf); err != nil {
			return pub.fail(err)
		}
	}
	err = ondisk.WriteVolumeDataIn(vd, made, p.podVolumeData(spec, vol))
	if err == nil {
		err = p.records.Write(ctx, pub.rec)
	}
	if err == nil && !made {
		_, err = vd.Verify(ondisk.PublishLeaf)
	}
	if err == nil {
		err = pub.client.Bound(p.timeout, p.steps).NodePublishVolume(ctx, pub.call)
	}
	if err != nil {
		// A republish that fails leaves all as it is: the pod may use what
		// the earlier publish left, and its record (now Publishing) makes
		// a restart find the volume Uncertain, to be published again.
		if !volume.IsUncertain(err) && !pub.req.Republish {
			cerr := p.removeVolumeDir(dir, ondisk.PublishLeaf)
			if cerr == nil {
				cerr = p.records.Remove(dir)
			}
			if cerr != nil {
				klog.FromContext(ctx).Error(cerr, "Cleaning up after a failed NodePublishVolume", "pod", klog.KRef(vol.Pod.Namespace, vol.Pod.Name), "volume", spec.Name, "driver", spec.Driver)
			}
		}
		return "", fmt.Errorf("publishing volume %s for pod %s at %s: %w", pub.desc, vol.Pod, target, err)
	}
	if pub.req.ChangeOwnership && vol.FSGroup != nil {
		// The volume is published: a failure here leaves it Uncertain, to be
		// published (and owned) again or torn down, as in the kubelet.
		d, err := p.rfs.OpenDir(target)
		if err == nil {
			err = p.changeOwnership(ctx, d, vol)
			d.Close()
		}
		if err != nil {
			return "", fmt.Errorf("publishing volume %s for pod %s: giving fsGroup %d ownership of %s: %w: %w",
				pub.desc, vol.Pod, *vol.FSGroup, target, err, volume.ErrInProgress)
		}
	}
	p.records.Update(ctx, pub.rec, ondisk.PhasePublished)
	if logger := klog.FromContext(ctx).V(4); logger.Enabled() {
		logger.Info("Volume published", "pod", klog.KRef(vol.Pod.Namespace, vol.Pod.Name), "volume", spec.Name, "driver", spec.Driver, "targetPath", target)
	}
	return target, nil
}

// verifyLeaf checks that directory dir exists (fs.ErrNotExist
// otherwise) and that neither it nor anything above it below the root is
// a symlink, nor its leaf (which may be missing), and returns the leaf's
// path: dir opened once and the leaf looked at from it, where a Stat of
// dir and a Verify of the leaf resolved dir twice.
func (p *plugin) verifyLeaf(dir, leaf string) (string, error) {
	d, err := p.rfs.Sub(dir)
	if err != nil {
		return "", err
	}
	defer d.Close()
	return d.Verify(leaf)
}

// podsDepth is how many components of a pod volume directory (relative to
// the root) are expected to exist before a publish: "pods".
const podsDepth = 1

// podVolumeData is the vol_data.json of a pod's volume.
func (p *plugin) podVolumeData(spec *podvol.VolumeSpec, vol podvol.PodVolume) *ondisk.VolumeData {
	d := &ondisk.VolumeData{
		SpecVolID:           ondisk.VolumeDirName(spec, vol),
		VolumeHandle:        spec.VolumeHandle,
		DriverName:          spec.Driver,
		NodeName:            p.node,
		AttachmentID:        AttachmentName(spec.VolumeHandle, spec.Driver, p.node),
		VolumeLifecycleMode: string(storagev1.VolumeLifecyclePersistent),
		SELinuxMountContext: vol.SELinuxLabel,
	}
	if spec.Ephemeral {
		d.VolumeLifecycleMode = string(storagev1.VolumeLifecycleEphemeral)
	}
	return d
}

// TearDown implements volume.Mounter: it unpublishes the volume
// with NodeUnpublishVolume and removes the "mount" directory (unless it is
// still a mount point), vol_data.json and the pod's volume directory. A
// volume whose directory does not exist is not published: nothing to do.
func (p *plugin) TearDown(ctx context.Context, req volume.MountRequest) error {
	spec, vol := req.Spec, req.Volume
	fail := func(err error) error {
		return fmt.Errorf("unpublishing volume %s from pod %s: %w", volumeDesc(spec), vol.Pod, err)
	}
	p, release, err := p.withRootHeld()
	if err != nil {
		return fail(err)
	}
	defer release()
	if spec.Mode == podvol.Block {
		return p.unmapPodDevice(ctx, req)
	}
	dir, err := ondisk.PodVolumeDir(p.root, vol.Pod.UID, ondisk.VolumeDirName(spec, vol))
	if err == nil {
		err = fsutil.ValidateName("driver name", spec.Driver)
	}
	if err != nil {
		return fail(err)
	}
	target, err := p.verifyLeaf(dir, ondisk.PublishLeaf)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fail(err)
	}
	client, err := p.drivers.Client(spec.Driver)
	if err != nil {
		return fail(err)
	}
	p.records.Update(ctx, p.podRecord(spec, vol, dir, req.PublishContext, client.Capabilities(), spec.NodePublishSecret), ondisk.PhaseUnpublishing)
	err = client.Bound(p.timeout, p.steps).NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{
		VolumeId:   spec.VolumeHandle,
		TargetPath: target,
	})
	if err != nil {
		return fmt.Errorf("unpublishing volume %s from pod %s at %s: %w", volumeDesc(spec), vol.Pod, target, kubeletWords("kubernetes.io/csi: Unmounter.TearDownAt failed: ", err))
	}
	if err := p.removeVolumeDir(dir, ondisk.PublishLeaf); err != nil {
		return fail(err)
	}
	if err := p.records.Remove(dir); err != nil {
		return fail(err)
	}
	if logger := klog.FromContext(ctx).V(4); logger.Enabled() {
		logger.Info("Volume unpublished", "pod", klog.KRef(vol.Pod.Namespace, vol.Pod.Name), "volume", spec.Name, "targetPath", target)
	}
	return nil
}
