package csiplugin

// What each CSI call is sent with, and nodevol's record of it, written
// before it is sent (internal/ondisk's Record). A publish's request and
// record are built in one place, at SetUp's entry (newPublication), from
// names checked once and a staging path found once.

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/nodevol/nodevol/csi"
	"github.com/nodevol/nodevol/internal/fsutil"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/podvol"
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

// publication is one NodePublishVolume of a volume for a pod, checked and
// built once, at SetUp's entry (newPublication): what the publish of a
// file-system volume (publish) and of a raw block volume (mapPodDevice)
// then do with it needs no name checked again.
type publication struct {
	req   volume.MountRequest
	desc  string // volumeDesc(req.Spec), for errors
	block bool   // a raw block volume
	// name is the spec name; dir a file-system volume's pod volume
	// directory, paths a block volume's paths.
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
// request (publishRequest, then its secrets and tokens) and its record.
// Errors are wrapped as SetUp's; desc is volumeDesc(req.Spec).
func (p *plugin) newPublication(ctx context.Context, req volume.MountRequest, desc string) (*publication, error) {
	spec, vol := req.Spec, req.Volume
	pub := &publication{req: req, desc: desc, block: spec.Mode == podvol.Block}
	fail := func(err error) (*publication, error) {
		_, err = pub.fail(err)
		return nil, err
	}
	target, err := p.publishTarget(pub)
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
	}
	caps := client.Capabilities()
	// Built first: it reads nothing that can fail.
	call := publishRequest(req, caps, driver)
	call.StagingTargetPath, call.TargetPath = p.publishStagingPath(pub, caps), target
	secretRef, err := p.addPublishCredentials(ctx, call, spec, vol.Pod, driver)
	if err != nil {
		return fail(err)
	}
	recDir := pub.dir
	if pub.block {
		recDir = target
	}
	pub.client, pub.call = client, call
	pub.rec = p.podRecord(spec, vol, recDir, req.PublishContext, caps, secretRef)
	pub.rec.Phase = ondisk.PhasePublishing
	return pub, nil
}

// publishStagingPath is the staging_target_path of pub's NodePublishVolume:
// where the stage put the volume (req.DeviceMountPath); or, for a driver
// that stages and a publish not told (after a restart), where the stage
// puts it: a block volume's staging path, or a file-system volume's
// directory, an older kubelet's legacy one or nodevol's
// (ondisk.FindStagingDir). "" for a volume that is not staged.
func (p *plugin) publishStagingPath(pub *publication, caps csi.Capabilities) string {
	spec := pub.req.Spec
	switch {
	case pub.req.DeviceMountPath != "" || !caps.StageUnstage:
		return pub.req.DeviceMountPath
	case pub.block:
		return pub.paths.StagingPath
	case spec.Ephemeral:
		return ""
	}
	dir, _, err := ondisk.FindStagingDir(p.rfs, p.root, spec.PVName, spec.Driver, spec.VolumeHandle)
	if err != nil {
		return ""
	}
	return filepath.Join(dir, ondisk.StagingLeaf)
}

// publishRequest builds req's NodePublishVolume request without its
// secrets, staging path and target path.
func publishRequest(req volume.MountRequest, caps csi.Capabilities, driver *storagev1.CSIDriver) *csipb.NodePublishVolumeRequest {
	spec, vol := req.Spec, req.Volume
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
	return &csipb.NodePublishVolumeRequest{
		VolumeId:         spec.VolumeHandle,
		PublishContext:   req.PublishContext,
		VolumeCapability: vc,
		Readonly:         vol.ReadOnly || spec.ReadOnly,
		VolumeContext:    volCtx,
	}
}

// addPublishCredentials adds to call the Secret the PV names (in the
// pod's namespace when it names none) and the service account tokens the
// driver asks for. It returns the Secret's reference for the record.
func (p *plugin) addPublishCredentials(ctx context.Context, call *csipb.NodePublishVolumeRequest, spec *podvol.VolumeSpec, pod podvol.PodRef, driver *storagev1.CSIDriver) (*podvol.SecretRef, error) {
	secretRef := spec.NodePublishSecret
	if secretRef != nil && secretRef.Namespace == "" {
		secretRef = &podvol.SecretRef{Namespace: pod.Namespace, Name: secretRef.Name}
	}
	words := publishSecretWords
	if spec.Mode == podvol.Block {
		words = blockPublishSecretWords
	}
	secrets, err := p.secretData(ctx, secretRef, "NodePublish", words)
	if err != nil {
		return nil, err
	}
	rm := requestMaps{volumeContext: call.VolumeContext, secrets: secrets}
	if err := p.addServiceAccountTokens(ctx, driver, pod, &rm); err != nil {
		return nil, err
	}
	call.VolumeContext, call.Secrets = rm.volumeContext, rm.secrets
	return secretRef, nil
}

// publishTarget checks the names of pub's request that become paths (the
// pod's UID and the spec name; a file-system volume's driver name too; a
// block volume's PV) and returns the path the driver publishes at, setting
// pub's paths.
func (p *plugin) publishTarget(pub *publication) (string, error) {
	spec, vol := pub.req.Spec, pub.req.Volume
	var err error
	if pub.block {
		pub.name, pub.paths, err = p.blockPaths(spec, vol.Pod.UID)
		return pub.paths.PublishPath, err
	}
	pub.name = ondisk.VolumeDirName(spec, vol)
	if pub.dir, err = ondisk.PodVolumeDir(p.root, vol.Pod.UID, pub.name); err != nil {
		return "", err
	}
	if err := fsutil.ValidateName("driver name", spec.Driver); err != nil {
		return "", err
	}
	return filepath.Join(pub.dir, ondisk.PublishLeaf), nil
}

// ephemeralRefusal is why an inline volume of a driver without a CSIDriver
// object cannot be published: the kubelet supports only Persistent volumes
// of such a driver. nil when the volume is not inline or the CSIDriver
// exists (the planner checks its volumeLifecycleModes).
func ephemeralRefusal(spec *podvol.VolumeSpec, driver *storagev1.CSIDriver) error {
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

// volumeRecord is the record of spec's directory dir.
func volumeRecord(spec *podvol.VolumeSpec, dir string, publishContext map[string]string, caps csi.Capabilities) *ondisk.Record {
	rec := &ondisk.Record{
		Dir: dir, Driver: spec.Driver, VolumeHandle: spec.VolumeHandle, PVName: spec.PVName,
		Ephemeral: spec.Ephemeral, Mode: string(spec.Mode), FSType: spec.FSType,
		MountOptions: spec.MountOptions, ReadOnly: spec.ReadOnly, PublishContext: publishContext,
		AccessMode:     caps.AccessMode(spec.AccessMode).String(),
		StageSecretRef: secretRef(spec.NodeStageSecret), PublishSecretRef: secretRef(spec.NodePublishSecret),
	}
	if rec.Mode == "" {
		rec.Mode = string(podvol.Filesystem)
	}
	return rec
}

func secretRef(s *podvol.SecretRef) *ondisk.RecordSecretRef {
	if s == nil {
		return nil
	}
	return &ondisk.RecordSecretRef{Namespace: s.Namespace, Name: s.Name}
}

// podRecord is the record of a pod's volume directory dir.
func (p *plugin) podRecord(spec *podvol.VolumeSpec, vol podvol.PodVolume, dir string, publishContext map[string]string, caps csi.Capabilities, publishSecret *podvol.SecretRef) *ondisk.Record {
	rec := volumeRecord(spec, dir, publishContext, caps)
	rec.PodUID, rec.PodNamespace, rec.PodName = string(vol.Pod.UID), vol.Pod.Namespace, vol.Pod.Name
	rec.SpecName = ondisk.VolumeDirName(spec, vol)
	rec.ReadOnly = vol.ReadOnly || spec.ReadOnly
	rec.PublishSecretRef = secretRef(publishSecret)
	return rec
}
