package registration

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	csiplugins "k8s.io/csi-translation-lib/plugins"
)

// migratedPlugins are the in-tree volume plugins whose volumes nodevol
// mounts through their CSI driver (CSI migration), sorted. They are the
// kubelet's: every in-tree plugin that k8s.io/csi-translation-lib
// translates, each always migrated (CSIMigration and the per-plugin gates
// are GA and locked on; CSIMigrationPortworx since 1.33). There is no
// switch to turn one off: nodevol has no in-tree plugin to fall back on,
// and a node that does not list a plugin makes the attach/detach
// controller treat its volumes as in-tree ones, which no current
// controller can attach.
var migratedPlugins = []string{
	csiplugins.AWSEBSInTreePluginName,
	csiplugins.AzureDiskInTreePluginName,
	csiplugins.AzureFileInTreePluginName,
	csiplugins.CinderInTreePluginName,
	csiplugins.GCEPDInTreePluginName,
	csiplugins.PortworxVolumePluginName,
	csiplugins.VSphereInTreePluginName,
}

// MigratedPlugins returns the names of the in-tree volume plugins whose
// volumes nodevol translates to CSI (e.g. "kubernetes.io/gce-pd"), sorted.
// The CSINode's migrated-plugins annotation lists them.
func MigratedPlugins() []string { return slices.Clone(migratedPlugins) }

// IsMigratedPlugin reports whether the volumes of in-tree plugin name are
// mounted through CSI.
func IsMigratedPlugin(name string) bool {
	_, found := slices.BinarySearch(migratedPlugins, name)
	return found
}

// migratedPluginsAnnotation sets the CSINode annotation
// storage.alpha.kubernetes.io/migrated-plugins to the migrated in-tree
// plugins, sorted and comma separated, as the kubelet writes it, and
// reports whether it changed anything. As in the kubelet, the old value
// is compared as a set: the same plugins in another order are left alone.
func migratedPluginsAnnotation(cn *storagev1.CSINode) bool {
	old := cn.Annotations[corev1.MigratedPluginsAnnotationKey]
	var have []string
	if old != "" {
		have = strings.Split(old, ",")
	}
	slices.Sort(have)
	if slices.Equal(slices.Compact(have), migratedPlugins) {
		return false
	}
	if cn.Annotations == nil {
		cn.Annotations = map[string]string{}
	}
	cn.Annotations[corev1.MigratedPluginsAnnotationKey] = strings.Join(migratedPlugins, ",")
	return true
}
