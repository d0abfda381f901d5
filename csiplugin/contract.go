package csiplugin

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	csitranslation "k8s.io/csi-translation-lib"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/csiplugin/internal/reconstruct"
	"github.com/nodevol/nodevol/internal/csimigration"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

var translator = csitranslation.New()

var _ volume.Reconstructor = (*plugin)(nil)

// Name implements volume.Plugin: the kubelet's name of its CSI plugin,
// podvol.CSIPluginName, with which every CSI volume's unique name starts
// (podvol.CSIVolumeName).
func (p *plugin) Name() string { return podvol.CSIPluginName }

// CanSupport implements volume.Plugin: the CSI plugin handles claims
// (persistentVolumeClaim, and ephemeral, whose claim the pod owns), inline
// CSI volumes and inline volumes of an in-tree plugin that CSI migration
// translates (MigratedPlugins). A claim's PV is checked when it is
// resolved: one with neither a CSI source nor a migrated one is an error
// then.
func (p *plugin) CanSupport(v *v1.Volume) bool {
	if v.PersistentVolumeClaim != nil || v.Ephemeral != nil || v.CSI != nil {
		return true
	}
	name, err := translator.GetInTreePluginNameFromSpec(nil, v)
	return err == nil && csimigration.IsMigratedPlugin(name)
}

// Capabilities implements volume.Plugin. An inline volume is neither
// attached nor staged; a PV is attached unless its CSIDriver says
// attachRequired: false (no CSIDriver: attached, as in the kubelet) and
// staged when the driver has STAGE_UNSTAGE_VOLUME. A raw block volume is
// always staged: its stage sets up the per-node map directories and
// vol_data.json that its unstage removes after the last pod, and sends
// NodeStageVolume only when the driver stages (as the kubelet's
// SetUpDevice and TearDownDevice). The fsGroup walk is
// nodevol's when the driver lacks VOLUME_MOUNT_GROUP and the CSIDriver's
// fsGroupPolicy asks for it for this volume (see needsOwnership). The
// lifecycle modes are the CSIDriver's volumeLifecycleModes, or with none
// listed only Persistent. Without a CSIDriver, the kubelet's defaults hold
// (attachRequired true, podInfoOnMount, requiresRepublish and seLinuxMount
// false, fsGroupPolicy ReadWriteOnceWithFSType, no tokenRequests) and only
// Persistent is supported: a PV's modes are Persistent, and an inline
// volume's none, for its publish refuses it with an error that names the
// missing CSIDriver (ephemeralRefusal). An unregistered driver is an error
// wrapping volume.ErrNotReady.
func (p *plugin) Capabilities(spec *podvol.VolumeSpec) (volume.Capabilities, error) {
	driver, client, err := p.driverAndClient(spec.Driver)
	if err != nil {
		return volume.Capabilities{}, fmt.Errorf("capabilities of volume %s: %w", volumeDesc(spec), err)
	}
	attach := driver == nil || driver.Spec.AttachRequired == nil || *driver.Spec.AttachRequired
	// A writable pod use with some fsGroup: what is left of needsOwnership
	// is the volume's and the driver's part of the decision.
	anyGroup := podvol.PodVolume{FSGroup: new(int64)}
	modes := []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent}
	switch {
	case driver != nil && len(driver.Spec.VolumeLifecycleModes) > 0:
		modes = driver.Spec.VolumeLifecycleModes
	case driver == nil && spec.Ephemeral:
		// Not the planner's refusal, whose words are about the CSIDriver's
		// list: the publish refuses it, naming the missing object
		// (ephemeralRefusal), as the kubelet's SetUp does.
		modes = nil
	}
	return volume.Capabilities{
		Attachable: !spec.Ephemeral && attach,
		Stages:     !spec.Ephemeral && (client.Capabilities().StageUnstage || spec.Mode == podvol.Block),
		Block:      true,
		Republish:  driver != nil && driver.Spec.RequiresRepublish != nil && *driver.Spec.RequiresRepublish,
		// The driver refreshes what it serves (requiresRepublish); it
		// reads nothing through the node's object cache.
		RepublishAtResyncOnly: true,
		OwnershipChange:       needsOwnership(spec, anyGroup, client.Capabilities(), driver),
		LifecycleModes:        modes,
	}, nil
}

// CallName implements volume.CallNamer: the CSI RPC each method makes,
// which is what a user of a CSI driver reads in a wait error
// ("NodePublishVolume still running after 3s"); "" for the attachment's
// methods, which call no driver (they write or wait for the
// VolumeAttachment) and keep the kubelet's words.
func (p *plugin) CallName(m volume.Method, _ *podvol.VolumeSpec) string {
	switch m {
	case volume.MethodMountDevice:
		return "NodeStageVolume"
	case volume.MethodUnmountDevice:
		return "NodeUnstageVolume"
	case volume.MethodSetUp:
		return "NodePublishVolume"
	case volume.MethodTearDown:
		return "NodeUnpublishVolume"
	case volume.MethodNodeExpand:
		return "NodeExpandVolume"
	}
	return ""
}

// Reconstruct implements volume.Reconstructor: the CSI volumes earlier
// runs (nodevol's or the kubelet's) left on disk, each in the state it was
// left in (package reconstruct: a volume recorded as done on this boot
// whose leaf is still a mount point is Mounted, any other Uncertain; a
// reboot's leftovers are removed). The scan is one operation on the root,
// held once: every directory it lists, file it reads and leftover it
// removes is resolved from the one handle, so that it sees one directory
// throughout, as a stage or a publish does. It runs once, at start.
func (p *plugin) Reconstruct(ctx context.Context, rc volume.Recovery) volume.Found {
	if h, release, err := p.withRootHeld(); err != nil {
		// Each call opens the root by itself and fails or not as it would.
		klog.FromContext(ctx).Error(err, "Cannot hold the root for the scan; scanning without a hold", "root", p.root)
	} else {
		defer release()
		p = h
	}
	return reconstruct.Find(ctx, p.rfs, p.root, rc)
}

// Retake implements volume.Reconstructor: it removes pod volume directory
// dir (absolute), found unreadable at start, once nothing in it can hold
// data any more (reconstruct.Retake).
func (p *plugin) Retake(ctx context.Context, dir string, mounted map[string]bool) bool {
	p, release, err := p.withRootHeld()
	if err != nil {
		return false
	}
	defer release()
	return reconstruct.Retake(ctx, p.rfs, dir, mounted)
}
