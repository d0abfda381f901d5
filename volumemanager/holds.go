package volumemanager

import (
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volumemanager/internal/resolve"
)

// holdAttachment makes volume name hold the VolumeAttachment va in the
// object cache ("": none).
func (vm *VolumeManager) holdAttachment(name podvol.UniqueVolumeName, va string) {
	if va == "" {
		vm.objects.Release(resolve.AttachmentHolder(name))
		return
	}
	vm.objects.Hold(resolve.AttachmentHolder(name), objectcache.Ref{Kind: objectcache.VolumeAttachment, Name: va})
}

// podsOfVolumes returns the pods to resolve again for changed volumes
// (PersistentVolume refs of the object cache): those holding one that
// are not resolved yet.
func (l *loop) podsOfVolumes(refs map[objectcache.Ref]struct{}) []types.UID {
	if l.hooks.holders == nil {
		return nil
	}
	var out []types.UID
	for r := range refs {
		if r.Kind != objectcache.PersistentVolume {
			continue
		}
		if l.hooks.expansionClaim != nil {
			if n, ok := l.dsw.VolumeForPV(r.Name); ok {
				l.queue.add(n) // its node expansion may be due
			}
		}
		for _, h := range l.hooks.holders(r) {
			if uid := types.UID(h); l.pods.Hold(uid) != "" {
				out = append(out, uid)
			}
		}
	}
	return out
}
