package reconciler

import (
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/internal/objectcache"
)

// podsOfVolumes returns the pods to resolve again for changed volumes
// (PersistentVolume refs of the object cache): those holding one that
// are not resolved yet.
func (l *Loop) podsOfVolumes(refs map[objectcache.Ref]struct{}) []types.UID {
	if l.Holders == nil {
		return nil
	}
	var out []types.UID
	for r := range refs {
		if r.Kind != objectcache.PersistentVolume {
			continue
		}
		if l.Expands {
			if n, ok := l.DSW.VolumeForPV(r.Name); ok {
				l.queue.add(n) // its node expansion may be due
			}
		}
		for _, h := range l.Holders.Holders(r) {
			if uid := types.UID(h); l.pods.Hold(uid) != "" {
				out = append(out, uid)
			}
		}
	}
	return out
}
