package objectcache

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// dropManagedFields is a transform as Config.Transform asks: a copy,
// without managedFields.
func dropManagedFields(obj runtime.Object) runtime.Object {
	out := obj.DeepCopyObject()
	if m, err := meta.Accessor(out); err == nil {
		m.SetManagedFields(nil)
	}
	return out
}

// TestTransform: what a read gives is kept as Config.Transform makes it,
// whether the read is a GET (a kind the node may only GET), a list or a
// watch event; without a transform it is kept as read.
func TestTransform(t *testing.T) {
	managed := []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationUpdate}}
	for _, tt := range []struct {
		name      string
		transform func(runtime.Object) runtime.Object
		want      int // managedFields entries kept
	}{
		{"transform", dropManagedFields, 0},
		{"none", nil, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pvc := claim("pv")
			pvc.ManagedFields = managed
			cm := configMap("ns", "cm", map[string]string{"k": "v1"})
			cm.ManagedFields = managed
			a := newAPI(pvc, cm)
			c, changes := start(t, a, Config{Transform: tt.transform})
			c.Hold("pod", pvcRef, cmRef)
			kept := func(what string, o runtime.Object) {
				t.Helper()
				m, err := meta.Accessor(o)
				if err != nil {
					t.Fatal(err)
				}
				if got := len(m.GetManagedFields()); got != tt.want {
					t.Errorf("%s: %d managedFields entries kept, want %d", what, got, tt.want)
				}
			}
			kept("the claim's GET", get(t, c, pvcRef))
			kept("the configMap's first read", get(t, c, cmRef))
			recv(t, a.opened, "the configMap's watch")
			changed := configMap("ns", "cm", map[string]string{"k": "v2"})
			changed.ManagedFields = managed
			if _, err := a.CoreV1().ConfigMaps("ns").Update(context.Background(), changed, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			// The claim's first answer may be announced too; wait for the configMap's.
			for recv(t, changes, "the update announced") != cmRef {
			}
			o := get(t, c, cmRef)
			if dataOf(t, o) != "v2" {
				t.Fatalf("the configMap after the update: %v", o)
			}
			kept("the configMap's watch event", o)
			if len(cm.ManagedFields) != 1 || len(pvc.ManagedFields) != 1 {
				t.Error("the objects given to the fake API were written")
			}
		})
	}
}
