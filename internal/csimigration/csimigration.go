// Package csimigration lists the in-tree volume plugins whose volumes
// nodevol mounts through their CSI driver (CSI migration), as the kubelet
// v1.37 migrates them.
package csimigration

import (
	"slices"

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
