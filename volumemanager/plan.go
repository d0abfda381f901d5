package volumemanager

import (
	"sort"

	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/cache"
	oe "github.com/nodevol/nodevol/operationexecutor"
)

// plan decides what to do next for one volume, from what its pods want
// (desired; empty when no pod wants it) and what is done (actual). It does no
// I/O and keeps no state: the reconciler calls it after every change to the
// volume and runs the actions it returns.
//
// The order is the kubelet's: unpublish pods that no longer want the volume
// (Mounted or Uncertain) first; then, for a wanted volume, confirm the
// attachment, stage the device, and publish into each pod that lacks it; for
// an unwanted volume, unstage only once no pod may still have it published.
// done is true when nothing is left of an unwanted volume: the caller
// forgets it.
func plan(name cache.UniqueVolumeName, desired []cache.PodVolume, spec cache.VolumeSpec, actual cache.ActualVolume, known bool) (actions []oe.Action, done bool) {
	want := make(map[types.UID]cache.PodVolume, len(desired))
	for _, p := range desired {
		want[p.Pod.UID] = p
	}

	// Unpublish first, in a stable order.
	published := false
	uids := make([]types.UID, 0, len(actual.Pods))
	for uid := range actual.Pods {
		uids = append(uids, uid)
	}
	sort.Slice(uids, func(i, j int) bool { return uids[i] < uids[j] })
	for _, uid := range uids {
		pm := actual.Pods[uid]
		if !pm.State.MayBeMounted() {
			continue
		}
		published = true
		if _, ok := want[uid]; !ok {
			actions = append(actions, oe.Action{Kind: oe.OpUnpublish, Volume: name, Pod: pm.Volume})
		}
	}

	if len(desired) == 0 {
		switch {
		case !known:
			return nil, true
		case published:
			return actions, false // unstage waits for every unpublish
		case actual.DeviceState.MayBeMounted():
			return append(actions, oe.Action{Kind: oe.OpUnstage, Volume: name}), false
		default:
			return nil, true
		}
	}

	if !spec.Ephemeral {
		if !known || !actual.Attached {
			return append(actions, oe.Action{Kind: oe.OpAttach, Volume: name}), false
		}
		if actual.DeviceState != cache.Mounted {
			// NotMounted, or Uncertain: staging again is safe (NodeStage is idempotent).
			return append(actions, oe.Action{Kind: oe.OpStage, Volume: name}), false
		}
	}
	for _, p := range desired {
		if pm, ok := actual.Pods[p.Pod.UID]; !ok || pm.State != cache.Mounted {
			actions = append(actions, oe.Action{Kind: oe.OpPublish, Volume: name, Pod: p})
		}
	}
	return actions, false
}
