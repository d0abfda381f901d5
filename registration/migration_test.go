package registration

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodevol/nodevol/csi"
)

// The kubelet's value: the seven in-tree plugins, sorted, comma separated.
const wantMigratedPlugins = "kubernetes.io/aws-ebs,kubernetes.io/azure-disk,kubernetes.io/azure-file," +
	"kubernetes.io/cinder,kubernetes.io/gce-pd,kubernetes.io/portworx-volume,kubernetes.io/vsphere-volume"

func TestMigratedPluginsAnnotation(t *testing.T) {
	tests := []struct {
		name        string
		annotations map[string]string
		wantChanged bool
		want        map[string]string
	}{
		{"none", nil, true, map[string]string{corev1.MigratedPluginsAnnotationKey: wantMigratedPlugins}},
		{"others kept", map[string]string{"a": "b"}, true, map[string]string{"a": "b", corev1.MigratedPluginsAnnotationKey: wantMigratedPlugins}},
		{"fewer plugins", map[string]string{corev1.MigratedPluginsAnnotationKey: "kubernetes.io/gce-pd"}, true,
			map[string]string{corev1.MigratedPluginsAnnotationKey: wantMigratedPlugins}},
		{"same", map[string]string{corev1.MigratedPluginsAnnotationKey: wantMigratedPlugins}, false,
			map[string]string{corev1.MigratedPluginsAnnotationKey: wantMigratedPlugins}},
		{"same set, other order (kept, as by the kubelet)", map[string]string{corev1.MigratedPluginsAnnotationKey: "kubernetes.io/vsphere-volume,kubernetes.io/aws-ebs," +
			"kubernetes.io/azure-disk,kubernetes.io/azure-file,kubernetes.io/cinder,kubernetes.io/gce-pd,kubernetes.io/portworx-volume"}, false,
			map[string]string{corev1.MigratedPluginsAnnotationKey: "kubernetes.io/vsphere-volume,kubernetes.io/aws-ebs," +
				"kubernetes.io/azure-disk,kubernetes.io/azure-file,kubernetes.io/cinder,kubernetes.io/gce-pd,kubernetes.io/portworx-volume"}},
		{"empty value", map[string]string{corev1.MigratedPluginsAnnotationKey: ""}, true,
			map[string]string{corev1.MigratedPluginsAnnotationKey: wantMigratedPlugins}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cn := &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Annotations: tc.annotations}}
			if got := migratedPluginsAnnotation(cn); got != tc.wantChanged {
				t.Errorf("changed = %v, want %v", got, tc.wantChanged)
			}
			if len(cn.Annotations) != len(tc.want) {
				t.Fatalf("annotations = %v, want %v", cn.Annotations, tc.want)
			}
			for k, v := range tc.want {
				if cn.Annotations[k] != v {
					t.Errorf("annotation %s = %q, want %q", k, cn.Annotations[k], v)
				}
			}
		})
	}
}

// TestInstallWritesMigratedPlugins: the CSINode created or updated when a
// driver registers carries the migrated-plugins annotation; a CSINode that
// already has it is not written again for it.
func TestInstallWritesMigratedPlugins(t *testing.T) {
	ctx := context.Background()
	t.Run("created", func(t *testing.T) {
		n, client := nodeInfoTestSetup(t, nil, nil)
		if err := n.install(ctx, "a.example.com", csi.NodeInfo{NodeID: "id-1"}); err != nil {
			t.Fatal(err)
		}
		cn := getCSINode(t, client)
		if got := cn.Annotations[corev1.MigratedPluginsAnnotationKey]; got != wantMigratedPlugins || len(cn.Annotations) != 1 {
			t.Errorf("annotations = %v, want only %s=%s", cn.Annotations, corev1.MigratedPluginsAnnotationKey, wantMigratedPlugins)
		}
	})
	t.Run("updated", func(t *testing.T) {
		old := &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: nodeInfoTestNode,
			Annotations: map[string]string{corev1.MigratedPluginsAnnotationKey: "kubernetes.io/gce-pd", "keep": "me"}}}
		n, client := nodeInfoTestSetup(t, nil, nil, old)
		if err := n.install(ctx, "a.example.com", csi.NodeInfo{NodeID: "id-1"}); err != nil {
			t.Fatal(err)
		}
		cn := getCSINode(t, client)
		if got := cn.Annotations[corev1.MigratedPluginsAnnotationKey]; got != wantMigratedPlugins || cn.Annotations["keep"] != "me" {
			t.Errorf("annotations = %v", cn.Annotations)
		}
		if driverEntry(cn, "a.example.com") == nil {
			t.Error("driver entry missing")
		}
	})
	t.Run("only the annotation changes", func(t *testing.T) {
		// A registration that changes no driver entry still writes
		// the annotation (a CSINode left by an older agent).
		entry := csiNodeDriver("a.example.com", csi.NodeInfo{NodeID: "id-1"})
		old := &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: nodeInfoTestNode},
			Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{entry}}}
		n, client := nodeInfoTestSetup(t, nil, nil, old)
		if err := n.install(ctx, "a.example.com", csi.NodeInfo{NodeID: "id-1"}); err != nil {
			t.Fatal(err)
		}
		if got := getCSINode(t, client).Annotations[corev1.MigratedPluginsAnnotationKey]; got != wantMigratedPlugins {
			t.Errorf("annotation = %q, want %q", got, wantMigratedPlugins)
		}
		// Registered again: nothing left to write.
		client.ClearActions()
		if err := n.install(ctx, "a.example.com", csi.NodeInfo{NodeID: "id-1"}); err != nil {
			t.Fatal(err)
		}
		for _, a := range client.Actions() {
			if a.GetVerb() == "update" || a.GetVerb() == "create" {
				t.Errorf("unexpected %s of %s", a.GetVerb(), a.GetResource().Resource)
			}
		}
	})
}
