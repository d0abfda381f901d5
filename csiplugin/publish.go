package csiplugin

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"strconv"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/nodevol/nodevol/cache"
	"github.com/nodevol/nodevol/csi"
	"github.com/nodevol/nodevol/internal/fsutil"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/volume"
)

// publication is one NodePublishVolume of a volume for a pod, checked and
// built once, at SetUp's entry (newPublication): what the publish of a
// file-system volume (publish) and of a raw block volume (mapPodDevice)
// then do with it needs no name checked again.
type publication struct {
	req   volume.MountRequest
	desc  string // volumeDesc(req.Spec), for errors
	block bool   // a raw block volume
	// dir is a file-system volume's pod volume directory; name and paths
	// are a block volume's spec name and paths.
	dir    string
	name   string
	paths  ondisk.BlockPaths
	client *csi.Client
	// call is the request, its target path set; rec the record written,
	// in phase Publishing, before it is sent.
	call *csipb.NodePublishVolumeRequest
	rec  *ondisk.Record
}

// fail wraps err as a failed publish of pub's volume.
func (pub *publication) fail(err error) (string, error) {
	what := "volume"
	if pub.block {
		what = "block volume"
	}
	return "", fmt.Errorf("publishing %s %s for pod %s: %w", what, pub.desc, pub.req.Volume.Pod, err)
}

// newPublication checks the names of req that become paths (the pod's UID
// and the spec name; a file-system volume's driver name; a block volume's
// PV), finds the driver's CSIDriver and client, refuses an inline volume
// of a driver without a CSIDriver (ephemeralRefusal), and builds the
// request with its secrets and tokens, and its record. Errors are wrapped
// as SetUp's.
func (p *plugin) newPublication(ctx context.Context, req volume.MountRequest) (*publication, error) {
	spec, vol := req.Spec, req.Volume
	pub := &publication{req: req, desc: volumeDesc(spec), block: spec.Mode == cache.Block}
	fail := func(err error) (*publication, error) {
		_, err = pub.fail(err)
		return nil, err
	}
	var target string
	var err error
	if pub.block {
		pub.name, pub.paths, err = p.blockPaths(spec, vol.Pod.UID)
		target = pub.paths.PublishPath
	} else if pub.dir, err = ondisk.PodVolumeDir(p.root, vol.Pod.UID, ondisk.VolumeDirName(spec, vol)); err == nil {
		err = fsutil.ValidateName("driver name", spec.Driver)
		target = filepath.Join(pub.dir, ondisk.PublishLeaf)
	}
	if err != nil {
		return fail(err)
	}
	driver, client, err := p.driverAndClient(spec.Driver)
	if err != nil {
		return fail(err)
	}
	if !pub.block {
		if err := ephemeralRefusal(spec, driver); err != nil {
			return fail(err)
		}
	} else if req.DeviceMountPath == "" && client.Capabilities().StageUnstage {
		req.DeviceMountPath = pub.paths.StagingPath
	}
	call, secretRef, err := p.publishCall(ctx, req, client.Capabilities(), driver)
	if err != nil {
		return fail(err)
	}
	call.TargetPath = target
	recDir := pub.dir
	if pub.block {
		recDir = target
	}
	pub.client, pub.call = client, call
	pub.rec = p.podRecord(spec, vol, recDir, req.PublishContext, client.Capabilities(), secretRef)
	pub.rec.Phase = ondisk.PhasePublishing
	return pub, nil
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

// ephemeralRefusal is why an inline volume of a driver without a CSIDriver
// object cannot be published: the kubelet supports only Persistent volumes
// of such a driver. nil when the volume is not inline or the CSIDriver
// exists (the planner checks its volumeLifecycleModes).
func ephemeralRefusal(spec *cache.VolumeSpec, driver *storagev1.CSIDriver) error {
	if !spec.Ephemeral || driver != nil {
		return nil
	}
	err := fmt.Errorf("volume lifecycle mode %s not supported by driver %s: %s "+
		"(an inline CSI volume needs one whose volumeLifecycleModes lists %s; without one only %s volumes are supported, as with the kubelet)",
		storagev1.VolumeLifecycleEphemeral, spec.Driver, missingCSIDriver(spec.Driver),
		storagev1.VolumeLifecycleEphemeral, storagev1.VolumeLifecyclePersistent)
	return volume.WithCause(err, fmt.Sprintf("kubernetes.io/csi: mounter.SetupAt failed to check volume lifecycle mode: volume mode %q not supported by driver %s (no CSIDriver object)",
		storagev1.VolumeLifecycleEphemeral, spec.Driver))
}
