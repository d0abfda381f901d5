package csiplugin

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"

	storagev1 "k8s.io/api/storage/v1"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/nodevol/nodevol/csi"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// withSELinuxContext adds the mount option context="<label>" to a mount
// capability, as the kubelet's AddSELinuxMountOption does for
// NodeStageVolume and NodePublishVolume: after the PV's mount options,
// quoted, since an MCS level holds commas (s0:c1,c2). The caller decides
// whether the volume gets one (volumemanager: the CSIDriver's
// seLinuxMount, the host, the access mode, the pod); "" adds nothing, and
// a block capability is left alone.
func withSELinuxContext(vc *csipb.VolumeCapability, label string) *csipb.VolumeCapability {
	m := vc.GetMount()
	if label == "" || m == nil {
		return vc
	}
	// A copy: the flags are the spec's mount options, shared.
	m.MountFlags = append(slices.Clone(m.MountFlags), fmt.Sprintf("context=%q", label))
	return vc
}

// mountGroup is the fsGroup a driver gets as volume_mount_group in
// NodeStageVolume and NodePublishVolume: the pod's, when the driver applies
// it itself (VOLUME_MOUNT_GROUP) and its CSIDriver's fsGroupPolicy is not
// None (File, or the default ReadWriteOnceWithFSType); else nil. The fsType
// and access mode rules of ReadWriteOnceWithFSType decide only whether
// nodevol changes ownership itself (needsOwnership): delegation does not
// look at the volume, as in the kubelet. (The kubelet delegates under None
// too; nodevol reads None as "leave the volume's ownership alone".)
func mountGroup(caps csi.Capabilities, driver *storagev1.CSIDriver, fsGroup *int64) *int64 {
	if !caps.VolumeMountGroup || fsGroup == nil {
		return nil
	}
	if driver != nil && driver.Spec.FSGroupPolicy != nil && *driver.Spec.FSGroupPolicy == storagev1.NoneFSGroupPolicy {
		return nil
	}
	return fsGroup
}

// volumeCapability builds the capability a volume is staged and published
// with: a block volume for Block mode, else a mount volume with the PV's
// fsType and mountOptions, and the pod's fsGroup as volume_mount_group when
// fsGroup is given (the caller checks the driver may apply it).
func volumeCapability(spec *podvol.VolumeSpec, caps csi.Capabilities, fsGroup *int64) *csipb.VolumeCapability {
	vc := &csipb.VolumeCapability{
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: caps.AccessMode(spec.AccessMode)},
	}
	if spec.Mode == podvol.Block {
		vc.AccessType = &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}}
		return vc
	}
	m := &csipb.VolumeCapability_MountVolume{FsType: spec.FSType, MountFlags: spec.MountOptions}
	if fsGroup != nil {
		m.VolumeMountGroup = strconv.FormatInt(*fsGroup, 10)
	}
	vc.AccessType = &csipb.VolumeCapability_Mount{Mount: m}
	return vc
}

// publishRequest builds a NodePublishVolume request without its secrets
// and target path.
func (p *plugin) publishRequest(spec *podvol.VolumeSpec, vol podvol.PodVolume, req volume.MountRequest,
	caps csi.Capabilities, driver *storagev1.CSIDriver) *csipb.NodePublishVolumeRequest {
	fsGroup := mountGroup(caps, driver, vol.FSGroup)
	vc := withSELinuxContext(volumeCapability(spec, caps, fsGroup), vol.SELinuxLabel)
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
	stagingPath := req.DeviceMountPath
	if stagingPath == "" && caps.StageUnstage && !spec.Ephemeral {
		if dir, _, err := ondisk.FindStagingDir(p.rfs, p.root, spec.PVName, spec.Driver, spec.VolumeHandle); err == nil {
			stagingPath = filepath.Join(dir, ondisk.StagingLeaf)
		}
	}
	return &csipb.NodePublishVolumeRequest{
		VolumeId:          spec.VolumeHandle,
		PublishContext:    req.PublishContext,
		StagingTargetPath: stagingPath,
		VolumeCapability:  vc,
		Readonly:          vol.ReadOnly || spec.ReadOnly,
		VolumeContext:     volCtx,
	}
}

// publishCall builds the NodePublishVolume request of req without its
// target path: publishRequest (built first: it reads nothing that can
// fail) with the Secret the PV names (in the pod's
// namespace when it names none) and the service account tokens the
// driver asks for. It returns the Secret's reference for the record.
func (p *plugin) publishCall(ctx context.Context, req volume.MountRequest, caps csi.Capabilities, driver *storagev1.CSIDriver) (*csipb.NodePublishVolumeRequest, *podvol.SecretRef, error) {
	spec, vol := req.Spec, req.Volume
	csiReq := p.publishRequest(spec, vol, req, caps, driver)
	secretRef := spec.NodePublishSecret
	if secretRef != nil && secretRef.Namespace == "" {
		secretRef = &podvol.SecretRef{Namespace: vol.Pod.Namespace, Name: secretRef.Name}
	}
	words := publishSecretWords
	if spec.Mode == podvol.Block {
		words = blockPublishSecretWords
	}
	secrets, err := p.secretData(ctx, secretRef, "NodePublish", words)
	if err != nil {
		return nil, nil, err
	}
	rm := requestMaps{volumeContext: csiReq.VolumeContext, secrets: secrets}
	if err := p.addServiceAccountTokens(ctx, driver, vol.Pod, &rm); err != nil {
		return nil, nil, err
	}
	csiReq.VolumeContext, csiReq.Secrets = rm.volumeContext, rm.secrets
	return csiReq, secretRef, nil
}
