package csimigration

import (
	"slices"
	"testing"

	csitranslation "k8s.io/csi-translation-lib"
)

func TestMigratedPlugins(t *testing.T) {
	got := MigratedPlugins()
	if !slices.IsSorted(got) || len(got) != 7 {
		t.Fatalf("MigratedPlugins = %q, want the 7 in-tree plugins sorted", got)
	}
	tr := csitranslation.New()
	for _, name := range got {
		if !tr.IsMigratableIntreePluginByName(name) {
			t.Errorf("%s: csi-translation-lib has no translation for it", name)
		}
		if !IsMigratedPlugin(name) {
			t.Errorf("IsMigratedPlugin(%s) = false", name)
		}
	}
	for _, name := range []string{"kubernetes.io/nfs", "kubernetes.io/csi", ""} {
		if IsMigratedPlugin(name) {
			t.Errorf("IsMigratedPlugin(%q) = true", name)
		}
	}
	got[0] = "changed"
	if MigratedPlugins()[0] == "changed" {
		t.Error("MigratedPlugins returned its own slice")
	}
}
