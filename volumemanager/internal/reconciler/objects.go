package reconciler

import (
	"maps"

	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volumemanager/internal/state"
)

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
func (l *Loop) republishChanged(uid types.UID, resolved []state.DesiredVolume) {
	for _, dv := range resolved {
		old, ok := l.DSW.Spec(dv.Spec.Name)
		switch {
		case !ok: // first seen in this run: found Mounted at start?
		case dv.Spec.Plugin == "" || maps.Equal(old.Attributes, dv.Spec.Attributes):
			// A CSI volume's attributes are its PV's, published again
			// at resyncs.
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
func (l *Loop) objectsChanged(refs map[objectcache.Ref]struct{}) {
	if l.Holders == nil {
		return
	}
	for ref := range refs {
		if ref.Kind == objectcache.PersistentVolume {
			continue // resolves its pods again (podsOfVolumes)
		}
		for _, holder := range l.Holders.Holders(ref) {
			l.podContentChanged(types.UID(holder))
		}
	}
}

// podContentChanged acts on a change of what pod uid reads through the
// node (an object it holds, a pod certificate): each of its volumes that
// republishes on such a change (Capabilities.Republish and not
// RepublishAtResyncOnly: not a CSI driver's) is published again if
// Mounted, and in any case planned with its backoff forgotten, so that one
// that failed on a missing object is set up when the object comes, not
// when its backoff ends, up to two minutes later.
func (l *Loop) podContentChanged(uid types.UID) {
	pod, ok := l.DSW.Pod(uid)
	if !ok {
		return
	}
	for _, name := range pod.Volumes {
		spec, ok := l.DSW.Spec(name)
		if !ok {
			continue
		}
		if caps, err := l.capabilities(&spec); err != nil || !caps.Republish || caps.RepublishAtResyncOnly {
			continue
		}
		if actual, ok := l.ASW.Volume(name); ok {
			if pm, ok := actual.Pods[uid]; ok && pm.State == podvol.Mounted {
				l.vol(name).markRepublish(uid)
			}
		}
		l.retry(name)
	}
}

// republishPodVolume marks pod uid's volume name for publishing again if
// it is Mounted and its plugin republishes it, and plans the volume.
func (l *Loop) republishPodVolume(uid types.UID, name podvol.UniqueVolumeName) {
	actual, ok := l.ASW.Volume(name)
	if !ok {
		return
	}
	if pm, ok := actual.Pods[uid]; !ok || pm.State != podvol.Mounted {
		return
	}
	if caps, err := l.capabilities(&actual.Spec); err != nil || !caps.Republish {
		return
	}
	l.vol(name).markRepublish(uid)
	l.retry(name) // a new object lands at once, not after a backoff
}

// podCredentialsChanged publishes again, or at once, the volumes of pods
// whose pod certificate was issued, renewed, denied or failed: a projected
// volume still waiting for its first certificate (its publish failed with
// ErrNotReady) is published without waiting out its backoff.
func (l *Loop) podCredentialsChanged(pods map[types.UID]struct{}) {
	for uid := range pods {
		l.podContentChanged(uid)
	}
}
