package resolve

import (
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// TrimInformerObject is the transform of the informers nodevol makes itself
// (not of a Config.InformerFactory, whose other users may read anything):
// it drops, before an object is stored, what no code of nodevol reads, so
// that the cache of every claim, volume, attachment and CSIDriver of the
// cluster costs what nodevol needs of them. It returns a shallow copy and
// writes nothing it was given (a map it trims is copied): the object need
// not be the informer's own, and client-go's fake clientset hands every
// watcher the very objects its tracker keeps (its Watch delivers the
// existing ones uncopied), so an in-place trim raced the tracker's reads
// under -race. The copy costs one struct per event; the fields it shares
// are kept either way. It is idempotent, as client-go's TransformFunc must
// be.
//
// Dropped from every object: managedFields (often the larger half of an
// object), kubectl's last-applied-configuration annotation (a copy of the
// object as applied) and finalizers. Kept: name, namespace, UID,
// resourceVersion (expansion compares it), labels (CSI migration of GCE PD
// volumes reads a PV's zone labels), the other annotations (a PV's
// pv.beta.kubernetes.io/gid, what csi-translation-lib reads), ownerReferences
// (generic ephemeral claims), deletionTimestamp, and spec and status, except:
//   - a VolumeAttachment's spec.source.inlineVolumeSpec, a whole PV spec of a
//     migrated inline volume: nodevol writes it when it attaches itself and
//     reads its attachments' node, attacher, volume name and status only.
//
// A claim's requests and capacity and a volume's capacity are kept, but
// equal ones share one map (resourceLists, intern.go).
//
// TestTrimInformerObject lists what each reader needs and checks that it is
// left.
func TrimInformerObject(obj any) (any, error) {
	switch in := obj.(type) {
	case *v1.PersistentVolumeClaim:
		o := *in
		trimMeta(&o.ObjectMeta)
		o.Spec.Resources.Requests = resourceLists.intern(o.Spec.Resources.Requests)
		o.Spec.Resources.Limits = resourceLists.intern(o.Spec.Resources.Limits)
		o.Status.Capacity = resourceLists.intern(o.Status.Capacity)
		o.Status.AllocatedResources = resourceLists.intern(o.Status.AllocatedResources)
		return &o, nil
	case *v1.PersistentVolume:
		o := *in
		trimMeta(&o.ObjectMeta)
		o.Spec.Capacity = resourceLists.intern(o.Spec.Capacity)
		return &o, nil
	case *storagev1.VolumeAttachment:
		o := *in
		trimMeta(&o.ObjectMeta)
		o.Spec.Source.InlineVolumeSpec = nil
		return &o, nil
	case *storagev1.CSIDriver:
		o := *in
		trimMeta(&o.ObjectMeta)
		return &o, nil
	}
	return obj, nil
}

// TrimCachedObject is the object cache's transform (objectcache.Config):
// the claims, volumes and attachments read one at a time (unless
// Config.ClusterInformers) are trimmed as the informers' are, for as long
// as the node's pods
// hold them. ConfigMaps, secrets and ClusterTrustBundles are kept as read.
func TrimCachedObject(obj runtime.Object) runtime.Object {
	switch obj.(type) {
	case *v1.PersistentVolumeClaim, *v1.PersistentVolume, *storagev1.VolumeAttachment:
		trimmed, _ := TrimInformerObject(obj)
		return trimmed.(runtime.Object)
	}
	return obj
}

// trimMeta trims m, a shallow copy: its fields are set, never written
// through (the annotations are copied when one goes).
func trimMeta(m *metav1.ObjectMeta) {
	m.ManagedFields = nil
	m.Finalizers = nil
	if _, ok := m.Annotations[v1.LastAppliedConfigAnnotation]; ok {
		kept := make(map[string]string, len(m.Annotations)-1)
		for k, v := range m.Annotations {
			if k != v1.LastAppliedConfigAnnotation {
				kept[k] = v
			}
		}
		m.Annotations = kept
		if len(kept) == 0 {
			m.Annotations = nil
		}
	}
}
