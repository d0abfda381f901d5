package objectcache

import (
	"context"
	"fmt"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// Kind names a kind of object the cache reads. Each is one entry of the
// kinds table below: adding a kind is adding an entry.
type Kind string

// The kinds the cache reads.
const (
	// ConfigMap is a core/v1 ConfigMap (namespaced).
	ConfigMap Kind = "ConfigMap"
	// Secret is a core/v1 Secret (namespaced).
	Secret Kind = "Secret"
	// ClusterTrustBundle is a certificates.k8s.io/v1 ClusterTrustBundle
	// (cluster-scoped; GA in 1.37). A selecting Ref may select on the
	// field spec.signerName.
	ClusterTrustBundle Kind = "ClusterTrustBundle"
	// PersistentVolumeClaim is a core/v1 PersistentVolumeClaim
	// (namespaced). The Node authorizer lets a node GET the claims of its
	// pods, not list or watch them: read in ModeGet.
	PersistentVolumeClaim Kind = "PersistentVolumeClaim"
	// PersistentVolume is a core/v1 PersistentVolume (cluster-scoped),
	// GET only, as a claim.
	PersistentVolume Kind = "PersistentVolume"
	// VolumeAttachment is a storage/v1 VolumeAttachment (cluster-scoped),
	// GET only, as a claim; one missing or not attached yet is read
	// again sooner than the TTL (see kindInfo.quick).
	VolumeAttachment Kind = "VolumeAttachment"
)

// The quick reads of an object that is about to change (a
// VolumeAttachment the attacher has not attached yet): the first a second
// after the last read, each next one half as long again, up to pollMax,
// never longer than the TTL; as the kubelet polls a VolumeAttachment
// while it waits for the attach.
const (
	pollFirst = time.Second
	pollMax   = 10 * time.Second
)

// kindInfo is how the cache reads one kind.
type kindInfo struct {
	resource schema.GroupResource
	// version is the API version the cache reads (the typed client's).
	version string
	// since is the first Kubernetes version whose API server serves
	// that version by default, for the error of one that does not (""
	// for a kind every supported API server serves).
	since      string
	namespaced bool
	// getOnly: the Node authorizer lets a node GET objects of this kind
	// but not list or watch them (claims, volumes, attachments), so they
	// are read in Get mode whatever the Config's Mode; only a named Ref
	// may hold them.
	getOnly bool
	// quick reports an object (nil: missing) that is read again sooner
	// than the TTL, pollFirst growing to pollMax (nil: none is).
	quick func(runtime.Object) bool
	// onCue: an object of this kind, once found, is not read again every
	// TTL but when cued: when a held object whose kind's cues name it
	// changes, or when a new holder holds it a TTL after its last read.
	// A missing one, or one whose read failed, is read again as any
	// other.
	onCue bool
	// cues names the objects read on cue that a change of an object of
	// this kind may go with (nil: none): a claim's volume, whose size
	// the resizer changes before it marks the claim.
	cues  func(runtime.Object) []Ref
	get   func(ctx context.Context, c kubernetes.Interface, ns, name string, opts metav1.GetOptions) (runtime.Object, error)
	list  func(ctx context.Context, c kubernetes.Interface, ns string, opts metav1.ListOptions) (runtime.Object, error)
	watch func(ctx context.Context, c kubernetes.Interface, ns string, opts metav1.ListOptions) (watch.Interface, error)
	// immutable reports an object that can no longer change (nil: none
	// can): it is kept and no longer watched.
	immutable func(runtime.Object) bool
	// fields are the fields, beyond metadata.name and
	// metadata.namespace, that a selecting Ref may select on, with
	// their values for an object (nil: none).
	fields func(runtime.Object) fields.Set
}

// typedClient is what the cache needs of a generated typed client.
type typedClient[T, L runtime.Object] interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error)
	List(ctx context.Context, opts metav1.ListOptions) (L, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// reads fills in the get, list and watch of a kind from its typed client.
func reads[T, L runtime.Object](k kindInfo, client func(c kubernetes.Interface, ns string) typedClient[T, L]) kindInfo {
	k.get = func(ctx context.Context, c kubernetes.Interface, ns, name string, opts metav1.GetOptions) (runtime.Object, error) {
		o, err := client(c, ns).Get(ctx, name, opts)
		if err != nil {
			return nil, err
		}
		return o, nil
	}
	k.list = func(ctx context.Context, c kubernetes.Interface, ns string, opts metav1.ListOptions) (runtime.Object, error) {
		l, err := client(c, ns).List(ctx, opts)
		if err != nil {
			return nil, err
		}
		return l, nil
	}
	k.watch = func(ctx context.Context, c kubernetes.Interface, ns string, opts metav1.ListOptions) (watch.Interface, error) {
		return client(c, ns).Watch(ctx, opts)
	}
	return k
}

// kinds is the table of kinds the cache reads.
var kinds = map[Kind]kindInfo{
	ConfigMap: reads(kindInfo{
		resource:   corev1.Resource("configmaps"),
		version:    "v1",
		namespaced: true,
		immutable: func(o runtime.Object) bool {
			cm, ok := o.(*corev1.ConfigMap)
			return ok && cm.Immutable != nil && *cm.Immutable
		},
	}, func(c kubernetes.Interface, ns string) typedClient[*corev1.ConfigMap, *corev1.ConfigMapList] {
		return c.CoreV1().ConfigMaps(ns)
	}),
	Secret: reads(kindInfo{
		resource:   corev1.Resource("secrets"),
		version:    "v1",
		namespaced: true,
		immutable: func(o runtime.Object) bool {
			s, ok := o.(*corev1.Secret)
			return ok && s.Immutable != nil && *s.Immutable
		},
	}, func(c kubernetes.Interface, ns string) typedClient[*corev1.Secret, *corev1.SecretList] {
		return c.CoreV1().Secrets(ns)
	}),
	ClusterTrustBundle: reads(kindInfo{
		resource: certificatesv1.Resource("clustertrustbundles"),
		version:  certificatesv1.SchemeGroupVersion.Version,
		since:    "1.37",
		fields: func(o runtime.Object) fields.Set {
			b, ok := o.(*certificatesv1.ClusterTrustBundle)
			if !ok {
				return fields.Set{"spec.signerName": ""}
			}
			return fields.Set{"spec.signerName": b.Spec.SignerName}
		},
	}, func(c kubernetes.Interface, _ string) typedClient[*certificatesv1.ClusterTrustBundle, *certificatesv1.ClusterTrustBundleList] {
		return c.CertificatesV1().ClusterTrustBundles()
	}),
	PersistentVolumeClaim: reads(kindInfo{
		resource:   corev1.Resource("persistentvolumeclaims"),
		version:    "v1",
		namespaced: true,
		getOnly:    true,
		cues: func(o runtime.Object) []Ref {
			if pvc, ok := o.(*corev1.PersistentVolumeClaim); ok && pvc.Spec.VolumeName != "" {
				return []Ref{{Kind: PersistentVolume, Name: pvc.Spec.VolumeName}}
			}
			return nil
		},
	}, func(c kubernetes.Interface, ns string) typedClient[*corev1.PersistentVolumeClaim, *corev1.PersistentVolumeClaimList] {
		return c.CoreV1().PersistentVolumeClaims(ns)
	}),
	// A volume is read on cue: what changes it while a node uses it (the
	// resizer's new size, the binder's claimRef) changes its claim next,
	// so re-reading it with its claim every TTL only doubles the reads.
	PersistentVolume: reads(kindInfo{resource: corev1.Resource("persistentvolumes"), version: "v1", getOnly: true, onCue: true},
		func(c kubernetes.Interface, _ string) typedClient[*corev1.PersistentVolume, *corev1.PersistentVolumeList] {
			return c.CoreV1().PersistentVolumes()
		}),
	VolumeAttachment: reads(kindInfo{
		resource: storagev1.Resource("volumeattachments"),
		version:  storagev1.SchemeGroupVersion.Version,
		getOnly:  true,
		quick: func(o runtime.Object) bool {
			va, ok := o.(*storagev1.VolumeAttachment)
			return !ok || !va.Status.Attached
		},
	}, func(c kubernetes.Interface, _ string) typedClient[*storagev1.VolumeAttachment, *storagev1.VolumeAttachmentList] {
		return c.StorageV1().VolumeAttachments()
	}),
}

// items returns the objects of a list and its resource version.
func items(list runtime.Object) ([]runtime.Object, string, error) {
	objs, err := meta.ExtractList(list)
	if err != nil {
		return nil, "", fmt.Errorf("reading the list: %w", err)
	}
	l, err := meta.ListAccessor(list)
	if err != nil {
		return nil, "", fmt.Errorf("reading the list: %w", err)
	}
	return objs, l.GetResourceVersion(), nil
}
