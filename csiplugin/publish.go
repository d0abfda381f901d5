package csiplugin

import (
	"context"
	"fmt"
	"path/filepath"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/nodevol/nodevol/csi"
	"github.com/nodevol/nodevol/internal/fsutil"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/podvol"
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

// newPublication checks the names of req that become paths (the pod's UID
// and the spec name; a file-system volume's driver name; a block volume's
// PV), finds the driver's CSIDriver and client, refuses an inline volume
// of a driver without a CSIDriver (ephemeralRefusal), and builds the
// request with its secrets and tokens, and its record. Errors are wrapped
// as SetUp's; desc is volumeDesc(req.Spec).
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
