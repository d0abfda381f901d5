package volumemanager

import (
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/internal/objectcache"
)

// podsOfVolumes returns the pods to resolve again for changed volumes
// (PersistentVolume refs of the object cache): those holding one that
// are not resolved yet.
func (l *loop) podsOfVolumes(refs map[objectcache.Ref]struct{}) []types.UID {
	if l.holders == nil {
		return nil
	}
	var out []types.UID
	for r := range refs {
		if r.Kind != objectcache.PersistentVolume {
			continue
		}
		if l.expands {
			if n, ok := l.dsw.VolumeForPV(r.Name); ok {
				l.queue.add(n) // its node expansion may be due
			}
		}
		for _, h := range l.holders.Holders(r) {
			if uid := types.UID(h); l.pods.Hold(uid) != "" {
				out = append(out, uid)
			}
		}
	}
	return out
}
