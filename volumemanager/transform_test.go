package volumemanager

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// TestInformerTransformInstalled: the informers nodevol makes trim what
// they store; a Config.InformerFactory's are not touched (its other users
// may read anything).
func TestInformerTransformInstalled(t *testing.T) {
	for _, own := range []bool{true, false} {
		t.Run(map[bool]string{true: "own informers", false: "Config.InformerFactory"}[own], func(t *testing.T) {
			pvc, pv := csitest.BoundClaim("ns", "claim", csitest.PVSpec{Driver: "drv.example.com", Handle: "handle"})
			noise(&pvc.ObjectMeta, nil)
			client := fake.NewSimpleClientset(pvc, pv) //nolint:staticcheck // as the other tests
			drv := csitest.New(t, csitest.Options{})
			cfg := Config{NodeName: node, KubeClient: client, RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil), ClusterInformers: true}
			if !own {
				cfg.InformerFactory = informers.NewSharedInformerFactory(client, 0)
			}
			vm, stop := startVMWith(t, cfg, drv)
			defer stop()
			got, err := vm.resolver.PVCs.PersistentVolumeClaims("ns").Get("claim")
			if err != nil {
				t.Fatal(err)
			}
			want := pvc.DeepCopy()
			if own {
				want.ManagedFields, want.Finalizers, want.Annotations = nil, nil, nil
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("the informer's claim (-want +got):\n%s", diff)
			}
		})
	}
}

// noise adds to an object's metadata what the API server and kubectl put
// there and nodevol never reads, next to what it reads.
func noise(m *metav1.ObjectMeta, keep map[string]string) {
	m.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate,
		FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:status":{"f:phase":{}}}`)}}
	m.Finalizers = []string{"kubernetes.io/pv-protection"}
	m.Annotations = map[string]string{v1.LastAppliedConfigAnnotation: `{"apiVersion":"v1"}`}
	for k, v := range keep {
		m.Annotations[k] = v
	}
}
