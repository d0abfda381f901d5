package resolve

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

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

// TestTrimInformerObject: each kind, from an object as the API server
// gives it to what the informer keeps, exactly; applied twice as once.
func TestTrimInformerObject(t *testing.T) {
	now := metav1.Now()
	pvc, pv := csitest.BoundClaim("ns", "claim", csitest.PVSpec{
		Driver:      "drv.example.com",
		Handle:      "handle",
		AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOncePod},
	})
	pvc.Labels = map[string]string{"app": "db"}
	pvc.OwnerReferences = []metav1.OwnerReference{{Kind: "Pod", Name: "p", UID: "pod-uid", Controller: ptr.To(true)}}
	pvc.DeletionTimestamp = &now
	pvc.Status.Conditions = []v1.PersistentVolumeClaimCondition{{Type: v1.PersistentVolumeClaimFileSystemResizePending, Status: v1.ConditionTrue}}
	pvc.Status.AllocatedResourceStatuses = map[v1.ResourceName]v1.ClaimResourceStatus{v1.ResourceStorage: v1.PersistentVolumeClaimNodeResizePending}
	wantPVC := pvc.DeepCopy()
	noise(&pvc.ObjectMeta, map[string]string{"volume.kubernetes.io/selected-node": "n1"})
	wantPVC.Annotations = map[string]string{"volume.kubernetes.io/selected-node": "n1"}

	pv.Labels = map[string]string{v1.LabelTopologyZone: "us-central1-a"}
	wantPV := pv.DeepCopy()
	noise(&pv.ObjectMeta, map[string]string{"pv.beta.kubernetes.io/gid": "1234"})
	wantPV.Annotations = map[string]string{"pv.beta.kubernetes.io/gid": "1234"}

	pvName := pv.Name
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: "csi-123", ResourceVersion: "7"},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: "drv.example.com", NodeName: node,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName}},
		Status: storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: map[string]string{"devicePath": "/dev/sdb"},
			DetachError: &storagev1.VolumeError{Message: "busy"}},
	}
	wantVA := va.DeepCopy()
	noise(&va.ObjectMeta, nil)
	inline := va.DeepCopy()
	inline.Spec.Source = storagev1.VolumeAttachmentSource{InlineVolumeSpec: &v1.PersistentVolumeSpec{
		PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "drv.example.com", VolumeHandle: "h"}}}}
	wantInline := wantVA.DeepCopy()
	wantInline.Spec.Source = storagev1.VolumeAttachmentSource{}

	drv := csitest.CSIDriver("drv.example.com", csitest.CSIDriverSpec{AttachRequired: true, PodInfoOnMount: true, SELinuxMount: true})
	wantDrv := drv.DeepCopy()
	noise(&drv.ObjectMeta, nil)
	wantDrv.Annotations = nil

	other := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s", ManagedFields: pvc.ManagedFields}}

	for _, tt := range []struct {
		name    string
		in, out runtime.Object
	}{
		{"claim: bound, owned, being deleted, resize pending", pvc, wantPVC},
		{"volume: CSI, zone label, gid annotation", pv, wantPV},
		{"attachment of a PV", va, wantVA},
		{"attachment of a migrated inline volume: its spec", inline, wantInline},
		{"CSIDriver", drv, wantDrv},
		{"other kinds are left alone", other, other.DeepCopy()},
	} {
		t.Run(tt.name, func(t *testing.T) {
			in := tt.in.DeepCopyObject()
			got, err := TrimInformerObject(in)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.out, got); diff != "" {
				t.Errorf("trimInformerObject (-want +got):\n%s", diff)
			}
			// What it was given is not its own: the fake clientset's
			// watch hands out the objects its tracker keeps.
			if diff := cmp.Diff(tt.in, in); diff != "" {
				t.Errorf("trimInformerObject wrote to its input (-before +after):\n%s", diff)
			}
			again, err := TrimInformerObject(got.(runtime.Object).DeepCopyObject())
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(got, again); diff != "" {
				t.Errorf("not idempotent (-once +twice):\n%s", diff)
			}
		})
	}
}

// TestTrimInformerObjectResolves: the resolver gives the same volume spec
// from trimmed claims and volumes as from whole ones, for the readers of
// metadata: a PV's gid annotation, CSI migration of a GCE PD (its zone
// label is in the handle), a generic ephemeral claim (its owner).
func TestTrimInformerObjectResolves(t *testing.T) {
	pod := csitest.Pod("ns", "p", csitest.PodSpec{})
	csiPVC, csiPV := csitest.BoundClaim("ns", "csi", csitest.PVSpec{Driver: "drv.example.com", Handle: "handle-csi"})
	csiPV.Annotations = map[string]string{volumeGIDAnnotation: "1234"}
	gcePVC, gcePV := csitest.BoundClaim("ns", "gce", csitest.PVSpec{Driver: "unused.example.com", Handle: "unused"})
	gcePV.Spec.PersistentVolumeSource = v1.PersistentVolumeSource{GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{PDName: "disk-1", FSType: "ext4"}}
	gcePV.Labels = map[string]string{v1.LabelTopologyZone: "us-central1-a"}
	ephPVC, ephPV := csitest.BoundClaim("ns", "p-scratch", csitest.PVSpec{Driver: "drv.example.com", Handle: "handle-eph"})
	ephPVC.OwnerReferences = []metav1.OwnerReference{{Kind: "Pod", Name: pod.Name, UID: pod.UID, Controller: ptr.To(true)}}
	objs := []runtime.Object{csiPVC, csiPV, gcePVC, gcePV, ephPVC, ephPV}
	for _, o := range objs {
		m, _ := o.(metav1.Object)
		noisy := &metav1.ObjectMeta{}
		noise(noisy, m.GetAnnotations())
		m.SetManagedFields(noisy.ManagedFields)
		m.SetFinalizers(noisy.Finalizers)
		m.SetAnnotations(noisy.Annotations)
	}
	resolverOf := func(trim bool) *Resolver {
		pvcs := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
		pvs := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
		for _, o := range objs {
			var obj any = o.DeepCopyObject()
			if trim {
				obj, _ = TrimInformerObject(obj)
			}
			store := pvs
			if _, ok := obj.(*v1.PersistentVolumeClaim); ok {
				store = pvcs
			}
			if err := store.Add(obj); err != nil {
				t.Fatal(err)
			}
		}
		return &Resolver{Plugins: testPlugins, PVCs: corelisters.NewPersistentVolumeClaimLister(pvcs), PVs: corelisters.NewPersistentVolumeLister(pvs)}
	}
	whole, trimmed := resolverOf(false), resolverOf(true)
	inNS := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns"}}
	for _, tt := range []struct {
		claim string
		owner *v1.Pod
	}{
		{"csi", nil},
		{"gce", nil},
		{"p-scratch", pod},
	} {
		t.Run(tt.claim, func(t *testing.T) {
			want, err := whole.claimSpec(inNS, tt.claim, tt.owner)
			if err != nil {
				t.Fatalf("whole objects: %v", err)
			}
			got, err := trimmed.claimSpec(inNS, tt.claim, tt.owner)
			if err != nil {
				t.Fatalf("trimmed objects: %v", err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("claimSpec (-whole +trimmed):\n%s", diff)
			}
		})
	}
	// The readers are exercised: without them the comparison proves little.
	if spec, _ := trimmed.claimSpec(inNS, "csi", nil); spec.GID != "1234" {
		t.Errorf("GID = %q, want 1234", spec.GID)
	}
	if spec, _ := trimmed.claimSpec(inNS, "gce", nil); spec.VolumeHandle != "projects/UNSPECIFIED/zones/us-central1-a/disks/disk-1" {
		t.Errorf("migrated GCE PD handle = %q, want the zone from the PV's label", spec.VolumeHandle)
	}
}
