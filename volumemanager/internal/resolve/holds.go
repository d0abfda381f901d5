package resolve

import (
	"errors"
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"

	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/podvol"
)

// By default (Config.ClusterInformers false) the node reads
// PersistentVolumeClaims, PersistentVolumes and VolumeAttachments one at a
// time, with GET, and only those of its own pods: what the Node authorizer
// allows (it forbids listing and watching them), and what keeps a node's
// memory bounded by its pods rather than by the cluster. The Resolver and
// the CSI plugin read them from the node's object cache
// (internal/objectcache), where they are GET-only kinds, through the
// listers below:
//
//   - a pod holds its claims and the volumes they are bound to, as it
//     holds its configMaps and secrets (holdObjects): each is GET when
//     first held and dropped with its last holder; while held, a claim
//     is read again every ResyncPeriod plus up to half of it (as the
//     kubelet, at each pod sync), a volume when its claim changed (what
//     changes a used volume, the resizer's size or the binder's
//     claimRef, changes its claim after it) or a pod newly holds it a
//     ResyncPeriod or more after its last read;
//   - a read never blocks the loop (objectcache.Peek): before the first
//     answer it fails saying so, the pod waits, and the answer is
//     announced like an informer event (a claim: the pods waiting for it
//     resolve again; a volume: the pods holding it; an attachment: the
//     volume waiting for it is retried);
//   - a claim found bound makes its pod hold the volume at once (the pod
//     is resolved again on the claim's answer);
//   - the VolumeAttachment a volume waits for is held by the volume
//     while it waits (from the attach's start until it is confirmed, or
//     a self detach until it is gone), polled from 1 s growing to 10 s
//     while not attached;
//   - a failed GET is retried with the cache's backoff, and a known
//     object is kept meanwhile.

// errNoList is the error of a List of the object cache's listers: the
// node may not list claims, volumes or attachments, and nodevol reads them
// one at a time.
var errNoList = errors.New("the object cache reads claims, volumes and attachments one at a time, never a list")

// errNotRead is wrapped (besides the cache's own error) by the error of a
// claim, volume or attachment the object cache has no answer for yet: its
// first GET has not answered, or failed. Not known is not missing (a
// missing one is NotFound): a pod waiting for one is in the state of a pod
// before the informers' first list, and the hold of what was found on disk
// at start lasts while such a pod is known (Table.reading).
var errNotRead = errors.New("not read from the API server yet")

// ClaimRefs are the claims of pod's volumes and the volumes those
// the cache knows bound are bound to: what the pod holds besides
// PodObjects unless Config.ClusterInformers.
func ClaimRefs(objects *objectcache.Cache, pod *v1.Pod) []objectcache.Ref {
	var out []objectcache.Ref
	for _, v := range pod.Spec.Volumes {
		var claim string
		switch {
		case v.PersistentVolumeClaim != nil:
			claim = v.PersistentVolumeClaim.ClaimName
		case v.Ephemeral != nil:
			claim = pod.Name + "-" + v.Name
		default:
			continue
		}
		if claim == "" || strings.Contains(claim, "/") || strings.Contains(pod.Namespace, "/") {
			continue // refused by the Resolver before it reads anything
		}
		r := objectcache.Ref{Kind: objectcache.PersistentVolumeClaim, Namespace: pod.Namespace, Name: claim}
		out = append(out, r)
		if o, err := objects.Peek(r); err == nil {
			if pvc := o.(*v1.PersistentVolumeClaim); pvc.Spec.VolumeName != "" {
				out = append(out, objectcache.Ref{Kind: objectcache.PersistentVolume, Name: pvc.Spec.VolumeName})
			}
		}
	}
	return out
}

// AttachmentHolder is the holder name of a volume waiting for its
// VolumeAttachment in the object cache (a pod's is its UID, which has no
// slash; a volume's unique name has one).
func AttachmentHolder(name podvol.UniqueVolumeName) string { return "volume " + string(name) }

// peek reads one object of the cache as type T. An error other than
// NotFound (not answered yet, the reads failing, not held) wraps
// errNotRead.
func peek[T any](c *objectcache.Cache, r objectcache.Ref) (T, error) {
	var zero T
	o, err := c.Peek(r)
	if apierrors.IsNotFound(err) {
		return zero, err
	} else if err != nil {
		return zero, marked{err, errNotRead}
	}
	t, ok := o.(T)
	if !ok {
		return zero, fmt.Errorf("reading %s: the cache holds a %T", r, o)
	}
	return t, nil
}

// The listers over the object cache, for the Resolver and the CSI plugin.

type cachedPVCs struct{ c *objectcache.Cache }

func (cachedPVCs) List(labels.Selector) ([]*v1.PersistentVolumeClaim, error) {
	return nil, fmt.Errorf("listing PersistentVolumeClaims: %w", errNoList)
}

func (l cachedPVCs) PersistentVolumeClaims(ns string) corelisters.PersistentVolumeClaimNamespaceLister {
	return cachedNamespacedPVCs{c: l.c, ns: ns}
}

type cachedNamespacedPVCs struct {
	c  *objectcache.Cache
	ns string
}

func (l cachedNamespacedPVCs) List(labels.Selector) ([]*v1.PersistentVolumeClaim, error) {
	return nil, fmt.Errorf("listing PersistentVolumeClaims of namespace %s: %w", l.ns, errNoList)
}

func (l cachedNamespacedPVCs) Get(name string) (*v1.PersistentVolumeClaim, error) {
	return peek[*v1.PersistentVolumeClaim](l.c, objectcache.Ref{Kind: objectcache.PersistentVolumeClaim, Namespace: l.ns, Name: name})
}

type cachedPVs struct{ c *objectcache.Cache }

func (cachedPVs) List(labels.Selector) ([]*v1.PersistentVolume, error) {
	return nil, fmt.Errorf("listing PersistentVolumes: %w", errNoList)
}

func (l cachedPVs) Get(name string) (*v1.PersistentVolume, error) {
	return peek[*v1.PersistentVolume](l.c, objectcache.Ref{Kind: objectcache.PersistentVolume, Name: name})
}

type cachedVAs struct{ c *objectcache.Cache }

func (cachedVAs) List(labels.Selector) ([]*storagev1.VolumeAttachment, error) {
	return nil, fmt.Errorf("listing VolumeAttachments: %w", errNoList)
}

func (l cachedVAs) Get(name string) (*storagev1.VolumeAttachment, error) {
	return peek[*storagev1.VolumeAttachment](l.c, objectcache.Ref{Kind: objectcache.VolumeAttachment, Name: name})
}

var (
	_ corelisters.PersistentVolumeClaimLister          = cachedPVCs{}
	_ corelisters.PersistentVolumeLister               = cachedPVs{}
	_ storagelisters.VolumeAttachmentLister            = cachedVAs{}
	_ corelisters.PersistentVolumeClaimNamespaceLister = cachedNamespacedPVCs{}
)

// Listers returns the listers of claims, volumes and attachments over the
// object cache c, for the Resolver and the CSI plugin unless
// Config.ClusterInformers.
func Listers(c *objectcache.Cache) (corelisters.PersistentVolumeClaimLister, corelisters.PersistentVolumeLister, storagelisters.VolumeAttachmentLister) {
	return cachedPVCs{c}, cachedPVs{c}, cachedVAs{c}
}
