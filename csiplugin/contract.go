package csiplugin

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
	csitranslation "k8s.io/csi-translation-lib"

	"github.com/nodevol/nodevol/cache"
	"github.com/nodevol/nodevol/internal/registration"
	"github.com/nodevol/nodevol/volume"
)

// PluginName is the CSI plugin's name in a volume.Registry, the kubelet's:
// every CSI volume's unique name starts with it (cache.CSIVolumeName).
const PluginName = cache.CSIPluginName

var translator = csitranslation.New()

// Name implements volume.Plugin.
func (p *Plugin) Name() string { return PluginName }

// CanSupport implements volume.Plugin: the CSI plugin handles claims
// (persistentVolumeClaim, and ephemeral, whose claim the pod owns), inline
// CSI volumes and inline volumes of an in-tree plugin that CSI migration
// translates (MigratedPlugins). A claim's PV is checked when it is
// resolved: one with neither a CSI source nor a migrated one is an error
// then.
func (p *Plugin) CanSupport(v *v1.Volume) bool {
	if v.PersistentVolumeClaim != nil || v.Ephemeral != nil || v.CSI != nil {
		return true
	}
	name, err := translator.GetInTreePluginNameFromSpec(nil, v)
	return err == nil && registration.IsMigratedPlugin(name)
}

// Capabilities implements volume.Plugin. An inline volume is neither
// attached nor staged; a PV is attached unless its CSIDriver says
// attachRequired: false (no CSIDriver: attached, as in the kubelet) and
// staged when the driver has STAGE_UNSTAGE_VOLUME. The fsGroup walk is
// nodevol's when the driver lacks VOLUME_MOUNT_GROUP and the CSIDriver's
// fsGroupPolicy asks for it for this volume (see needsOwnership). An
// unregistered driver is an error wrapping volume.ErrNotReady.
func (p *Plugin) Capabilities(spec *cache.VolumeSpec) (volume.Capabilities, error) {
	client, err := p.drivers.Client(spec.Driver)
	if err != nil {
		return volume.Capabilities{}, fmt.Errorf("capabilities of volume %s: %w", volumeDesc(spec), err)
	}
	driver, err := p.csiDriver(spec.Driver)
	if err != nil {
		return volume.Capabilities{}, fmt.Errorf("capabilities of volume %s: %w", volumeDesc(spec), err)
	}
	attach := driver == nil || driver.Spec.AttachRequired == nil || *driver.Spec.AttachRequired
	// A writable pod use with some fsGroup: what is left of needsOwnership
	// is the volume's and the driver's part of the decision.
	anyGroup := cache.PodVolume{FSGroup: new(int64)}
	return volume.Capabilities{
		Attachable:      !spec.Ephemeral && attach,
		Stages:          !spec.Ephemeral && client.Capabilities().StageUnstage,
		Block:           true,
		Republish:       driver != nil && driver.Spec.RequiresRepublish != nil && *driver.Spec.RequiresRepublish,
		OwnershipChange: needsOwnership(spec, anyGroup, client.Capabilities(), driver),
	}, nil
}
