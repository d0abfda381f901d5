package csitest

import (
	"errors"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/nodevol/nodevol/testenv"
)

// checkBound fails t unless pvc and pv, as CreateBound returned them, are
// bound to each other as the PV controller leaves them, and are what
// client has stored.
func checkBound(t *testing.T, client kubernetes.Interface, pvc *v1.PersistentVolumeClaim, pv *v1.PersistentVolume) {
	t.Helper()
	if ref := pv.Spec.ClaimRef; ref == nil || ref.UID != pvc.UID || ref.Namespace != pvc.Namespace || ref.Name != pvc.Name || ref.Kind != "PersistentVolumeClaim" {
		t.Errorf("PV %s claimRef %+v, want claim %s/%s uid %s", pv.Name, ref, pvc.Namespace, pvc.Name, pvc.UID)
	}
	if pvc.Spec.VolumeName != pv.Name || pvc.Status.Phase != v1.ClaimBound || pv.Status.Phase != v1.VolumeBound {
		t.Errorf("claim volumeName %q phase %s, PV %s phase %s: want bound", pvc.Spec.VolumeName, pvc.Status.Phase, pv.Name, pv.Status.Phase)
	}
	if !pvc.Status.Capacity.Storage().Equal(*pv.Spec.Capacity.Storage()) || len(pvc.Status.AccessModes) == 0 {
		t.Errorf("claim status capacity %v access modes %v, want the PV's %v %v", pvc.Status.Capacity, pvc.Status.AccessModes, pv.Spec.Capacity, pv.Spec.AccessModes)
	}
	storedPVC, err := client.CoreV1().PersistentVolumeClaims(pvc.Namespace).Get(t.Context(), pvc.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	storedPV, err := client.CoreV1().PersistentVolumes().Get(t.Context(), pv.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if storedPVC.ResourceVersion != pvc.ResourceVersion || storedPVC.Status.Phase != v1.ClaimBound {
		t.Errorf("stored claim resourceVersion %s phase %s, returned %s", storedPVC.ResourceVersion, storedPVC.Status.Phase, pvc.ResourceVersion)
	}
	if storedPV.ResourceVersion != pv.ResourceVersion || storedPV.Status.Phase != v1.VolumeBound {
		t.Errorf("stored PV resourceVersion %s phase %s, returned %s", storedPV.ResourceVersion, storedPV.Status.Phase, pv.ResourceVersion)
	}
}

func TestCreateBoundClaimFake(t *testing.T) {
	tests := []struct {
		name string
		spec PVSpec
	}{
		{name: "filesystem", spec: PVSpec{Driver: "drv", Handle: "h-1"}},
		{name: "block RWX 5Gi", spec: PVSpec{Driver: "drv", Handle: "h-1", Block: true, AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteMany}, Capacity: "5Gi"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset()
			wantPVC, wantPV := BoundClaim("ns", "data", tt.spec)
			pvc, pv, err := CreateBound(t.Context(), client, wantPVC, wantPV)
			if err != nil {
				t.Fatal(err)
			}
			checkBound(t, client, pvc, pv)
			// A fake clientset keeps the builders' UIDs and names.
			if pvc.UID != wantPVC.UID || pv.Name != wantPV.Name || pv.UID != wantPV.UID {
				t.Errorf("claim uid %s, PV %s uid %s; want BoundClaim's %s, %s %s", pvc.UID, pv.Name, pv.UID, wantPVC.UID, wantPV.Name, wantPV.UID)
			}
		})
	}
}

func TestCreateBoundErrorsNameTheObject(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		verb, resource, subresource string
		want                        string
	}{
		{verb: "create", resource: "persistentvolumeclaims", want: "create PersistentVolumeClaim ns/data"},
		{verb: "create", resource: "persistentvolumes", want: "create PersistentVolume pvc-"},
		{verb: "update", resource: "persistentvolumeclaims", subresource: "status", want: "status of PersistentVolumeClaim ns/data"},
		{verb: "update", resource: "persistentvolumes", subresource: "status", want: "status of PersistentVolume pvc-"},
	}
	for _, tt := range tests {
		t.Run(tt.verb+" "+tt.resource+" "+tt.subresource, func(t *testing.T) {
			client := fake.NewClientset()
			client.PrependReactor(tt.verb, tt.resource, func(a k8stesting.Action) (bool, runtime.Object, error) {
				return a.GetSubresource() == tt.subresource, nil, boom
			})
			pvc, pv := BoundClaim("ns", "data", PVSpec{Driver: "drv", Handle: "h-1"})
			_, _, err := CreateBound(t.Context(), client, pvc, pv)
			if !errors.Is(err, boom) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want %v naming %q", err, boom, tt.want)
			}
		})
	}
}

func TestCreateBoundKeepsItsArguments(t *testing.T) {
	pvc, pv := BoundClaim("ns", "data", PVSpec{Driver: "drv", Handle: "h-1"})
	pvc.UID, pv.UID = "", ""
	pvc.Status = v1.PersistentVolumeClaimStatus{}
	refUID := pv.Spec.ClaimRef.UID
	client := fake.NewClientset()
	gotPVC, gotPV, err := CreateBound(t.Context(), client, pvc, pv)
	if err != nil {
		t.Fatal(err)
	}
	checkBound(t, client, gotPVC, gotPV)
	if gotPVC.UID == "" || gotPV.UID == "" {
		t.Errorf("claim uid %q, PV uid %q: want UIDs on a fake clientset too", gotPVC.UID, gotPV.UID)
	}
	if pvc.UID != "" || pvc.Status.Phase != "" || pv.UID != "" || pv.Spec.ClaimRef.UID != refUID {
		t.Errorf("CreateBound changed its arguments: %+v %+v", pvc.ObjectMeta, pv.Spec.ClaimRef)
	}
}

// TestIntegrationCreateBoundClaim creates a bound claim through a real
// kube-apiserver, which gives the claim a UID of its own: the volume's
// claimRef must name that one, and both statuses must be Bound as stored.
func TestIntegrationCreateBoundClaim(t *testing.T) {
	env := testenv.StartT(t, testenv.Options{})
	client := kubernetes.NewForConfigOrDie(env.Config())
	if _, err := client.CoreV1().Namespaces().Create(t.Context(), &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	built, builtPV := BoundClaim("ns", "data", PVSpec{Driver: "drv", Handle: "h-1", Block: true})
	pvc, pv, err := CreateBound(t.Context(), client, built, builtPV)
	if err != nil {
		t.Fatal(err)
	}
	checkBound(t, client, pvc, pv)
	if pvc.UID == built.UID {
		t.Errorf("claim uid %s is the builder's: the server was expected to give its own", pvc.UID)
	}
	if pv.Spec.VolumeMode == nil || *pv.Spec.VolumeMode != v1.PersistentVolumeBlock {
		t.Errorf("PV volumeMode %v, want Block (the option)", pv.Spec.VolumeMode)
	}
}
