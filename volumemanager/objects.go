package volumemanager

import (
	"maps"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/cache"
	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/volume/configmap"
	"github.com/nodevol/nodevol/volume/secret"
	"github.com/nodevol/nodevol/volumemanager/internal/state"
)

// podObjects returns the API objects a pod's volumes read and keep
// current (configMaps, secrets, ClusterTrustBundles of configMap, secret
// and projected volumes): the volume manager holds them in the node's one
// object cache for as long as the pod is known, as the kubelet registers a
// pod with its secret and configMap managers.
func podObjects(pod *v1.Pod) []objectcache.Ref {
	var out []objectcache.Ref
	ns := pod.Namespace
	for _, v := range pod.Spec.Volumes {
		switch {
		case v.ConfigMap != nil:
			out = append(out, configmap.Refs(ns, v.ConfigMap)...)
		case v.Secret != nil:
			out = append(out, secret.Refs(ns, v.Secret)...)
		case v.Projected != nil:
			for _, s := range v.Projected.Sources {
				switch {
				case s.ConfigMap != nil:
					out = append(out, configmap.Refs(ns, &v1.ConfigMapVolumeSource{LocalObjectReference: s.ConfigMap.LocalObjectReference})...)
				case s.Secret != nil:
					out = append(out, secret.Refs(ns, &v1.SecretVolumeSource{SecretName: s.Secret.Name})...)
				case s.ClusterTrustBundle != nil:
					if r, ok := trustBundleRef(s.ClusterTrustBundle); ok {
						out = append(out, r)
					}
				}
			}
		}
	}
	return out
}

// trustBundleRef is the object cache's Ref of a clusterTrustBundle
// projection: the bundle by name, or the bundles of a signer selected by
// labels. A selection with no label selector selects nothing (the API's
// rule): ok is false.
func trustBundleRef(p *v1.ClusterTrustBundleProjection) (objectcache.Ref, bool) {
	if p.Name != nil {
		return objectcache.Ref{Kind: objectcache.ClusterTrustBundle, Name: *p.Name}, true
	}
	if p.SignerName == nil || p.LabelSelector == nil {
		return objectcache.Ref{}, false
	}
	sel, err := metav1.LabelSelectorAsSelector(p.LabelSelector)
	if err != nil {
		sel = labels.Nothing()
	}
	return objectcache.Ref{Kind: objectcache.ClusterTrustBundle,
		Fields: fields.OneTermEqualSelector("spec.signerName", *p.SignerName).String(), Labels: sel.String()}, true
}

// objectHolder is the holder name of a pod in the object cache.
func objectHolder(uid types.UID) string { return string(uid) }

// republishChanged marks for republishing the pod's Mounted volumes whose
// plugin republishes them (Capabilities.Republish) and whose resolved spec
// changed (a downward API volume's values after a label change): their
// files follow the pod. It runs before the new specs replace the old.
func (l *loop) republishChanged(uid types.UID, resolved []state.DesiredVolume) {
	for _, dv := range resolved {
		old, _, ok := l.dsw.Volume(dv.Spec.Name)
		if !ok || maps.Equal(old.Attributes, dv.Spec.Attributes) {
			continue
		}
		l.republishPodVolume(uid, dv.Spec.Name)
	}
}

// objectsChanged marks for republishing the Mounted volumes that read the
// objects (configMap, secret, projected volumes) of the pods that hold
// them: a changed configMap reaches the pods' files at once, not at the
// next resync. The pods' volumes not set up yet are tried again at once
// too: one that failed on an object missing (or not yet readable by the
// node) is set up when the object comes, not when its backoff ends, up
// to two minutes later.
func (l *loop) objectsChanged(refs map[objectcache.Ref]struct{}) {
	if l.hooks.holders == nil {
		return
	}
	for ref := range refs {
		for _, holder := range l.hooks.holders(ref) {
			uid := types.UID(holder)
			for _, mv := range l.asw.PodVolumes(uid) {
				if mv.Plugin != cache.CSIPluginName {
					l.republishPodVolume(uid, mv.Name)
				}
			}
			l.retryNotMounted(uid)
		}
	}
}

// retryNotMounted forgets the backoff of pod uid's wanted volumes that
// are not Mounted for it and whose plugin republishes them (the plugins
// that read objects), and plans them.
func (l *loop) retryNotMounted(uid types.UID) {
	pod, ok := l.dsw.Pod(uid)
	if !ok {
		return
	}
	for _, name := range pod.Volumes {
		if actual, ok := l.asw.Volume(name); ok {
			if pm, ok := actual.Pods[uid]; ok && pm.State == cache.Mounted {
				continue
			}
		}
		spec, _, ok := l.dsw.Volume(name)
		if !ok || spec.Plugin == cache.CSIPluginName {
			continue
		}
		if caps, err := l.capabilities(&spec); err != nil || !caps.Republish {
			continue
		}
		l.retry(name)
	}
}

// republishPodVolume marks pod uid's volume name for publishing again if
// it is Mounted and its plugin republishes it, and plans the volume.
func (l *loop) republishPodVolume(uid types.UID, name cache.UniqueVolumeName) {
	actual, ok := l.asw.Volume(name)
	if !ok {
		return
	}
	if pm, ok := actual.Pods[uid]; !ok || pm.State != cache.Mounted {
		return
	}
	if caps, err := l.capabilities(&actual.Spec); err != nil || !caps.Republish {
		return
	}
	l.vol(name).markRepublish(uid)
	l.retry(name) // a new object lands at once, not after a backoff
}
