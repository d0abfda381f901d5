package resolve

import (
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	csitranslation "k8s.io/csi-translation-lib"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/internal/csimigration"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volumemanager/internal/planner"
)

// CSI migration: PVs and pod inline volumes of the in-tree plugins that
// csimigration.MigratedPlugins lists (awsElasticBlockStore, azureDisk,
// azureFile, cinder, gcePersistentDisk, portworxVolume, vsphereVolume) are
// translated with k8s.io/csi-translation-lib into a CSI PV, as the
// kubelet's populator does (csimigration.TranslateInTreeSpecToCSI), and
// then handled like any CSI PV: the translated driver and handle make the
// unique volume name, the staging path, the VolumeAttachment name the
// attach/detach controller creates from the same translation, and
// vol_data.json. An inline in-tree volume becomes a persistent (not
// ephemeral) CSI volume, attached and staged like a PV; its "PV name", the
// kubelet's spec name, is the translated PV's name (for example
// pd.csi.storage.gke.io-{pdName}), which names the pod's volume directory.

var translator = csitranslation.New()

// migratedPVPlugin returns the in-tree plugin of a PV that nodevol mounts
// through CSI migration, or "" when it has no migrated in-tree source.
func migratedPVPlugin(pv *v1.PersistentVolume) string {
	name, err := translator.GetInTreePluginNameFromSpec(pv, nil)
	if err != nil || !csimigration.IsMigratedPlugin(name) {
		return ""
	}
	return name
}

// migratedPVSpec is PVSpec for a PV without a CSI source: its in-tree
// source translated to CSI, or an error naming the PV and why (pod
// resolution sends other PVs to their own plugin first, volumeSpec; the
// self-attach adoption asks of any PV).
func migratedPVSpec(pv *v1.PersistentVolume) (podvol.VolumeSpec, error) {
	plugin := migratedPVPlugin(pv)
	if plugin == "" {
		return podvol.VolumeSpec{}, marked{fmt.Errorf("PV %s has no CSI source and no in-tree source that CSI migration translates (%s): not a CSI volume",
			pv.Name, strings.Join(csimigration.MigratedPlugins(), ", ")), planner.ErrUnknownSource}
	}
	csiPV, err := translator.TranslateInTreePVToCSI(klog.Background(), pv)
	if err != nil {
		return podvol.VolumeSpec{}, fmt.Errorf("PV %s: translating its %s source to CSI: %w", pv.Name, plugin, err)
	}
	if csiPV.Spec.CSI == nil {
		return podvol.VolumeSpec{}, fmt.Errorf("PV %s: translating its %s source to CSI gave no CSI source", pv.Name, plugin)
	}
	spec, err := PVSpec(csiPV)
	if err != nil {
		return podvol.VolumeSpec{}, fmt.Errorf("%w (translated from in-tree %s)", err, plugin)
	}
	spec.MigratedFrom = plugin
	return spec, nil
}

// migratedInlineSpec translates an inline volume of a migrated in-tree
// plugin (the CSI plugin's CanSupport decided it is one) to a persistent
// CSI volume spec.
func migratedInlineSpec(pod *v1.Pod, v *v1.Volume) (podvol.VolumeSpec, error) {
	plugin, err := translator.GetInTreePluginNameFromSpec(nil, v)
	if err != nil {
		return podvol.VolumeSpec{}, marked{fmt.Errorf("inline volume of kind %s: %w", volume.SourceKind(&v.VolumeSource), err), planner.ErrUnknownSource}
	}
	csiPV, err := translator.TranslateInTreeInlineVolumeToCSI(klog.Background(), v, pod.Namespace)
	if err != nil {
		return podvol.VolumeSpec{}, fmt.Errorf("translating inline %s volume to CSI: %w", plugin, err)
	}
	if csiPV.Spec.CSI == nil {
		return podvol.VolumeSpec{}, fmt.Errorf("translating inline %s volume to CSI gave no CSI source", plugin)
	}
	// The kubelet names the pod's directory after the translated PV,
	// escaped as a qualified name ("/" -> "~"): an Azure disk URI or a
	// vSphere volume path holds slashes.
	csiPV.Name = strings.ReplaceAll(csiPV.Name, "/", "~")
	spec, err := PVSpec(csiPV)
	if err != nil {
		return podvol.VolumeSpec{}, fmt.Errorf("inline %s volume translated to CSI: %w", plugin, err)
	}
	spec.MigratedFrom = plugin
	return spec, nil
}
