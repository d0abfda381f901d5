package volumemanager

import (
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// trimInformerObject is the transform of the informers nodevol makes itself
// (not of a Config.InformerFactory, whose other users may read anything):
// it drops, before an object is stored, what no code of nodevol reads, so
// that the cache of every claim, volume, attachment and CSIDriver of the
// cluster costs what nodevol needs of them. It changes the object in place
// (the informer's own copy, decoded for it) and is idempotent, as
// client-go's TransformFunc must be.
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
func trimInformerObject(obj any) (any, error) {
	switch o := obj.(type) {
	case *v1.PersistentVolumeClaim:
		trimMeta(&o.ObjectMeta)
		o.Spec.Resources.Requests = resourceLists.intern(o.Spec.Resources.Requests)
		o.Spec.Resources.Limits = resourceLists.intern(o.Spec.Resources.Limits)
		o.Status.Capacity = resourceLists.intern(o.Status.Capacity)
		o.Status.AllocatedResources = resourceLists.intern(o.Status.AllocatedResources)
	case *v1.PersistentVolume:
		trimMeta(&o.ObjectMeta)
		o.Spec.Capacity = resourceLists.intern(o.Spec.Capacity)
	case *storagev1.VolumeAttachment:
		trimMeta(&o.ObjectMeta)
		o.Spec.Source.InlineVolumeSpec = nil
	case *storagev1.CSIDriver:
		trimMeta(&o.ObjectMeta)
	}
	return obj, nil
}

func trimMeta(m *metav1.ObjectMeta) {
	m.ManagedFields = nil
	m.Finalizers = nil
	if _, ok := m.Annotations[v1.LastAppliedConfigAnnotation]; ok {
		delete(m.Annotations, v1.LastAppliedConfigAnnotation)
		if len(m.Annotations) == 0 {
			m.Annotations = nil
		}
	}
}
