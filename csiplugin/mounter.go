package csiplugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path/filepath"
	"strconv"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/cache"
	"github.com/nodevol/nodevol/csi"
	"github.com/nodevol/nodevol/internal/fsutil"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/volume"
)

// Keys of the pod information passed in the volume context to drivers
// whose CSIDriver sets podInfoOnMount.
const (
	podNameKey            = "csi.storage.k8s.io/pod.name"
	podNamespaceKey       = "csi.storage.k8s.io/pod.namespace"
	podUIDKey             = "csi.storage.k8s.io/pod.uid"
	serviceAccountNameKey = "csi.storage.k8s.io/serviceAccount.name"
	ephemeralKey          = "csi.storage.k8s.io/ephemeral"
)

// SetUp implements volume.Mounter: it publishes the volume with
// NodePublishVolume at PodVolumePath(root, podUID, VolumeDirName(...)) and
// returns that path. Before the call it creates the pod's volume directory
// (the driver creates the "mount" directory in it, as the CSI spec says)
// and writes vol_data.json there, in the kubelet's format. On a final
// error it removes them again, unless req.Republish; on an error wrapping
// ErrInProgress it leaves them. Idempotent, as NodePublishVolume is. It gives the pod's
// fsGroup ownership of the published files when req.ChangeOwnership says
// so (the planner decides, from Capabilities.OwnershipChange); whether the
// driver supports the volume's lifecycle mode is the planner's check
// (Capabilities.LifecycleModes), but for an inline volume of a driver
// without a CSIDriver, which SetUp refuses (ephemeralRefusal).
func (p *plugin) SetUp(ctx context.Context, req volume.MountRequest) (string, error) {
	spec, vol := req.Spec, req.Volume
	fail := func(err error) (string, error) {
		return "", fmt.Errorf("publishing volume %s for pod %s: %w", volumeDesc(spec), vol.Pod, err)
	}
	p, release, err := p.held()
	if err != nil {
		return fail(err)
	}
	defer release()
	if spec.Mode == cache.Block {
		return p.mapPodDevice(ctx, req)
	}
	dir, err := ondisk.PodVolumeDir(p.root, vol.Pod.UID, ondisk.VolumeDirName(spec, vol))
	if err != nil {
		return fail(err)
	}
	if err := fsutil.ValidateName("driver name", spec.Driver); err != nil {
		return fail(err)
	}
	driver, client, err := p.driverAndClient(spec.Driver)
	if err != nil {
		return fail(err)
	}
	if err := ephemeralRefusal(spec, driver); err != nil {
		return fail(err)
	}
	csiReq, secretRef, err := p.publishCall(ctx, req, client.Capabilities(), driver)
	if err != nil {
		return fail(err)
	}
	csiReq.TargetPath = filepath.Join(dir, ondisk.PublishLeaf)
	if err := p.rfs.MkdirAll(dir, 0o750); err != nil {
		return fail(err)
	}
	if _, err := p.rfs.Verify(csiReq.TargetPath); err != nil {
		return fail(err) // nothing written beside a symlink
	}
	err = ondisk.WriteVolumeData(p.rfs, dir, p.podVolumeData(spec, vol))
	rec := p.podRecord(spec, vol, dir, req.PublishContext, client.Capabilities(), secretRef)
	if err == nil {
		rec.Phase = ondisk.PhasePublishing
		err = p.records.Write(ctx, rec)
	}
	if err == nil {
		// The driver creates "mount"; one that is there must not be a
		// symlink. Checked right before the driver gets the path.
		_, err = p.rfs.Verify(csiReq.TargetPath)
	}
	if err == nil {
		err = client.Bound(p.timeout, p.steps).NodePublishVolume(ctx, csiReq)
	}
	// Built only when a line is written: WithValues allocates.
	logger := func() klog.Logger {
		return klog.FromContext(ctx).WithValues("pod", klog.KRef(vol.Pod.Namespace, vol.Pod.Name), "volume", spec.Name, "driver", spec.Driver)
	}
	if err != nil {
		// A republish that fails leaves all as it is: the pod may use what
		// the earlier publish left, and its record (now Publishing) makes
		// a restart find the volume Uncertain, to be published again.
		if !volume.IsUncertain(err) && !req.Republish {
			if cerr := p.removeVolumeDir(dir, ondisk.PublishLeaf); cerr != nil {
				logger().Error(cerr, "Cleaning up after a failed NodePublishVolume")
			} else if cerr := p.records.Remove(dir); cerr != nil {
				logger().Error(cerr, "Cleaning up after a failed NodePublishVolume")
			}
		}
		return "", fmt.Errorf("publishing volume %s for pod %s at %s: %w", volumeDesc(spec), vol.Pod, csiReq.TargetPath, err)
	}
	if req.ChangeOwnership && vol.FSGroup != nil {
		// The volume is published: a failure here leaves it Uncertain, to be
		// published (and owned) again or torn down, as in the kubelet.
		d, err := p.rfs.OpenDir(csiReq.TargetPath)
		if err == nil {
			err = p.changeOwnership(ctx, d, vol)
			d.Close()
		}
		if err != nil {
			return "", fmt.Errorf("publishing volume %s for pod %s: giving fsGroup %d ownership of %s: %w: %w",
				volumeDesc(spec), vol.Pod, *vol.FSGroup, csiReq.TargetPath, err, volume.ErrInProgress)
		}
	}
	p.records.Update(ctx, rec, ondisk.PhasePublished)
	if logger := klog.FromContext(ctx).V(4); logger.Enabled() {
		logger.Info("Volume published", "pod", klog.KRef(vol.Pod.Namespace, vol.Pod.Name), "volume", spec.Name, "driver", spec.Driver, "targetPath", csiReq.TargetPath)
	}
	return csiReq.TargetPath, nil
}

// publishRequest builds a NodePublishVolume request without its secrets
// and target path.
func (p *plugin) publishRequest(spec *cache.VolumeSpec, vol cache.PodVolume, req volume.MountRequest,
	caps csi.Capabilities, driver *storagev1.CSIDriver) *csipb.NodePublishVolumeRequest {
	stagingPath := req.DeviceMountPath
	if stagingPath == "" && caps.StageUnstage && !spec.Ephemeral {
		if dir, _, err := p.stagingDir(spec); err == nil {
			stagingPath = filepath.Join(dir, ondisk.StagingLeaf)
		}
	}
	fsGroup := mountGroup(caps, driver, vol.FSGroup)
	volCtx := spec.Attributes
	if driver != nil && driver.Spec.PodInfoOnMount != nil && *driver.Spec.PodInfoOnMount {
		volCtx = maps.Clone(spec.Attributes)
		if volCtx == nil {
			volCtx = map[string]string{}
		}
		volCtx[podNameKey] = vol.Pod.Name
		volCtx[podNamespaceKey] = vol.Pod.Namespace
		volCtx[podUIDKey] = string(vol.Pod.UID)
		volCtx[serviceAccountNameKey] = vol.Pod.ServiceAccount
		volCtx[ephemeralKey] = strconv.FormatBool(spec.Ephemeral)
	}
	return &csipb.NodePublishVolumeRequest{
		VolumeId:          spec.VolumeHandle,
		PublishContext:    req.PublishContext,
		StagingTargetPath: stagingPath,
		VolumeCapability:  withSELinuxContext(volumeCapability(spec, caps, fsGroup), vol.SELinuxLabel),
		Readonly:          vol.ReadOnly || spec.ReadOnly,
		VolumeContext:     volCtx,
	}
}

// publishCall builds the NodePublishVolume request of req without its
// target path: publishRequest with the Secret the PV names (in the pod's
// namespace when it names none) and the service account tokens the
// driver asks for. It returns the Secret's reference for the record.
func (p *plugin) publishCall(ctx context.Context, req volume.MountRequest, caps csi.Capabilities, driver *storagev1.CSIDriver) (*csipb.NodePublishVolumeRequest, *cache.SecretRef, error) {
	spec, vol := req.Spec, req.Volume
	secretRef := spec.NodePublishSecret
	if secretRef != nil && secretRef.Namespace == "" {
		secretRef = &cache.SecretRef{Namespace: vol.Pod.Namespace, Name: secretRef.Name}
	}
	words := publishSecretWords
	if spec.Mode == cache.Block {
		words = blockPublishSecretWords
	}
	secrets, err := p.secretData(ctx, secretRef, "NodePublish", words)
	if err != nil {
		return nil, nil, err
	}
	csiReq := p.publishRequest(spec, vol, req, caps, driver)
	rm := requestMaps{volumeContext: csiReq.VolumeContext, secrets: secrets}
	if err := p.addServiceAccountTokens(ctx, driver, vol.Pod, &rm); err != nil {
		return nil, nil, err
	}
	csiReq.VolumeContext, csiReq.Secrets = rm.volumeContext, rm.secrets
	return csiReq, secretRef, nil
}

// podVolumeData is the vol_data.json of a pod's volume.
func (p *plugin) podVolumeData(spec *cache.VolumeSpec, vol cache.PodVolume) *ondisk.VolumeData {
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
	p, release, err := p.held()
	if err != nil {
		return fail(err)
	}
	defer release()
	if spec.Mode == cache.Block {
		return p.unmapPodDevice(ctx, req)
	}
	dir, err := ondisk.PodVolumeDir(p.root, vol.Pod.UID, ondisk.VolumeDirName(spec, vol))
	if err == nil {
		err = fsutil.ValidateName("driver name", spec.Driver)
	}
	if err != nil {
		return fail(err)
	}
	if _, err := p.rfs.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fail(err)
	}
	client, err := p.drivers.Client(spec.Driver)
	if err != nil {
		return fail(err)
	}
	target, err := p.rfs.Verify(filepath.Join(dir, ondisk.PublishLeaf))
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
