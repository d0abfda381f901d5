package registration

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/nodevol/nodevol/internal/csimigration"
)

// migratedPluginsAnnotation sets the CSINode annotation
// storage.alpha.kubernetes.io/migrated-plugins to the migrated in-tree
// plugins (package csimigration), sorted and comma separated, as the
// kubelet writes it, and reports whether it changed anything. As in the kubelet, the old value
// is compared as a set: the same plugins in another order are left alone.
func migratedPluginsAnnotation(cn *storagev1.CSINode) bool {
	old := cn.Annotations[corev1.MigratedPluginsAnnotationKey]
	var have []string
	if old != "" {
		have = strings.Split(old, ",")
	}
	slices.Sort(have)
	want := csimigration.MigratedPlugins()
	if slices.Equal(slices.Compact(have), want) {
		return false
	}
	if cn.Annotations == nil {
		cn.Annotations = map[string]string{}
	}
	cn.Annotations[corev1.MigratedPluginsAnnotationKey] = strings.Join(want, ",")
	return true
}
