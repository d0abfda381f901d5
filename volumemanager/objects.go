package volumemanager

import (
	"maps"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/cache"
	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/volume/configmap"
	"github.com/nodevol/nodevol/volume/projected"
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
			out = append(out, projected.Refs(ns, v.Projected)...)
		}
	}
	return out
}

// objectHolder is the holder name of a pod in the object cache.
func objectHolder(uid types.UID) string { return string(uid) }

// republishChanged marks for republishing the pod's Mounted volumes whose
// plugin republishes them (Capabilities.Republish) and whose resolved spec
// changed (a downward API volume's values after a label change): their
// files follow the pod. It runs before the new specs replace the old.
//
// A volume not yet desired but already Mounted for the pod is one an
// earlier run (or the kubelet) set up, reconstructed at start: it is
// published again too, as the kubelet remounts a pod's volumes at the
// pod's first sync (MarkRemountRequired), so that what changed while no
// one kept it current (a secret, the pod's labels, a token this run's
// cache never issued) reaches the files now, not at the next resync.
func (l *loop) republishChanged(uid types.UID, resolved []state.DesiredVolume) {
	for _, dv := range resolved {
		old, _, ok := l.dsw.Volume(dv.Spec.Name)
		if ok && maps.Equal(old.Attributes, dv.Spec.Attributes) {
			continue
		}
		l.republishPodVolume(uid, dv.Spec.Name)
	}
}

// objectsChanged marks for republishing the Mounted volumes that read the
// objects (configMap, secret, projected volumes) of the pods that hold
// them: a changed configMap reaches the pods' files at once, not at the
// next resync.
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
		}
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
