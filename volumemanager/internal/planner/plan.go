package planner

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"sort"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/podvol"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
)

// Plan decides what to do next for one volume. It does no I/O, reads no
// clock and keeps no state.
//
// The order is the kubelet's: unpublish pods that no longer want the
// volume first; then, for a wanted volume, confirm the attachment, stage
// the device, publish into each pod that lacks it, and expand (a pending
// expansion goes first, with the first publish when no pod has the volume
// published yet, so that pods see the new size as they start); for an
// unwanted volume, unstage only once no pod may still have it published,
// nothing holds the device and no mount references it, then delete the
// VolumeAttachment the node created itself (self-attach mode). An operation on the
// whole volume runs alone on it; operations on different pods' mounts run
// side by side. A key that is backing off after a failure of the same kind
// of operation waits until its backoff ends.
//
// It decides from the loop's facts too: which mounts and devices are held
// although no pod wants them (holds.go), whether a node expansion is due
// and the size the node has the volume at (expand.go), and that an
// unpublish cleans the pod's subPath mounts first (unpublishAction).
func Plan(v View) Decision {
	var d Decision
	// The world's changes and what was found on disk first: the rest of
	// the plan reads the view as they leave it.
	backoff := forgetBackoff(v, &d)
	v = adopt(v, &d)
	expandTo := expansion(v, &d)
	// Refusals first, whatever else waits: the loop reports a refusal that
	// is missing from a decision as ended.
	sel := admitSELinux(v)
	refused := refusals(v, sel)
	for _, p := range v.Desired {
		if err := refused[p.Pod.UID]; err != nil {
			d.Refused = append(d.Refused, Refusal{Pod: p, Err: err})
			d.wait("%v", err)
		}
	}
	for k, kind := range v.InFlight {
		if k.Pod == "" {
			d.wait("%s running", kind.NameFor(v.Spec.Mode))
			return d
		}
	}
	busy := len(v.InFlight) > 0
	podBusy := func(uid types.UID) bool {
		_, ok := v.InFlight[oe.Key{Volume: v.Name, Pod: uid}]
		return ok
	}
	add := func(a oe.Action) {
		if b := backoff[a.Key()]; b != nil && b.Kind == a.Kind && v.Now.Before(b.Until) {
			if d.Retry.IsZero() || b.Until.Before(d.Retry) {
				d.Retry = b.Until
			}
			d.wait("%s backing off until %s after %d failure(s)", a, b.Until.Format(time.RFC3339Nano), b.Failures)
			return
		}
		d.Actions = append(d.Actions, a)
	}
	want := make(map[types.UID]bool, len(v.Desired))
	for _, p := range v.Desired {
		want[p.Pod.UID] = true
	}

	// Unpublish first, in a stable order.
	published := false
	uids := make([]types.UID, 0, len(v.Actual.Pods))
	for uid := range v.Actual.Pods {
		uids = append(uids, uid)
	}
	sort.Slice(uids, func(i, j int) bool { return uids[i] < uids[j] })
	for _, uid := range uids {
		pm := v.Actual.Pods[uid]
		if !pm.MayBeMounted() && !podBusy(uid) {
			continue
		}
		published = true
		switch {
		case want[uid], podBusy(uid):
		default:
			if why := podHold(v, uid); why != "" {
				d.wait("unpublish from pod %s held: %s", uid, why)
			} else {
				add(unpublishAction(v, pm.Volume))
			}
		}
	}

	if len(v.Desired) == 0 {
		switch held := deviceHold(v); {
		case published || busy:
			// Unstage waits for every unpublish.
		case !v.Known:
			d.Done = true
		case !v.Actual.DeviceState.MayBeMounted() && v.Actual.SelfAttached && held != "":
			// An attachment found at start waits for the pods, as a device
			// found on disk does.
			d.wait("detach held: %s", held)
		case !v.Actual.DeviceState.MayBeMounted() && v.Actual.SelfAttached:
			// Detach last: the VolumeAttachment the node created goes
			// only once the device is unstaged.
			add(oe.Action{Kind: oe.OpSelfDetach, Volume: v.Name})
		case !v.Actual.DeviceState.MayBeMounted():
			d.Done = true
		default:
			unstage(v, &d, add)
		}
		return d
	}

	if v.CapsErr != nil {
		// Nothing is known of what the volume needs: not even whether to
		// confirm an attachment.
		d.NotReady = v.CapsErr
		d.wait("%v", v.CapsErr)
		return d
	}
	if len(d.Refused) == len(v.Desired) {
		return d // no pod may use it yet: nothing to set up
	}

	// A whole-volume operation runs alone: not beside one in flight, nor
	// beside an unpublish planned above.
	volumeOp := func(a oe.Action) Decision {
		if !busy && len(d.Actions) == 0 {
			add(a)
		}
		return d
	}
	if v.Caps.Attachable && (!v.Known || !v.Actual.Attached) {
		if v.SelfAttach {
			// The kubelet's own attach does not wait for volumesInUse:
			// no controller detaches what the node attached.
			return volumeOp(oe.Action{Kind: oe.OpSelfAttach, Volume: v.Name})
		}
		if v.AttachHeld {
			d.wait("attach confirmation waits until the volume is reported in use on the Node")
			return d
		}
		return volumeOp(oe.Action{Kind: oe.OpAttach, Volume: v.Name})
	}
	if v.Caps.Stages {
		if v.Actual.DeviceState.MayBeMounted() && !sel.Mounted && v.Actual.SELinuxContext != sel.Context {
			// Staged with an SELinux context that no pod wanting it has
			// (its pods are gone): unstage, then stage with the new one.
			if published || busy {
				d.wait("unstage (to stage again with SELinux context %q) waits for the unpublishes", sel.Context)
			} else {
				unstage(v, &d, add)
			}
			return d
		}
		if v.Actual.DeviceState != podvol.Mounted {
			// NotMounted, or Uncertain: staging again is safe (NodeStage is idempotent).
			return volumeOp(oe.Action{Kind: oe.OpStage, Volume: v.Name, SELinuxContext: sel.Context, Pod: stagePod(v, refused)})
		}
	}
	var mounted *podvol.PodVolume
	var publish []podvol.PodVolume
	for i, p := range v.Desired {
		if podBusy(p.Pod.UID) || refused[p.Pod.UID] != nil {
			continue
		}
		pm, ok := v.Actual.Pods[p.Pod.UID]
		switch {
		case !ok || pm.State != podvol.Mounted || v.Republish[p.Pod.UID] && v.Caps.Republish:
			publish = append(publish, p)
		case mounted == nil:
			mounted = &v.Desired[i]
		}
	}
	if expandTo > 0 && (mounted != nil || len(publish) > 0) {
		expandFirst(v, &d, add, busy, expandTo, mounted, publish)
		return d
	}
	for _, p := range publish {
		add(publishAction(v, p, 0))
	}
	return d
}

// publishAction publishes the volume into pod p (growing it to expand
// first, if > 0). It carries the ownership decision: the plugin gives the
// pod's fsGroup ownership of the volume's files when it changes ownership
// for this volume (Caps.OwnershipChange, the driver's and the volume's
// part) and the pod has an fsGroup and mounts the volume writable. It is
// a republish when the pod may be using the volume already: Mounted, or
// Uncertain as found on disk at start (the kubelet's IsRemount and
// ReconstructedVolume), so that a failure leaves what is there.
func publishAction(v View, p podvol.PodVolume, expand int64) oe.Action {
	pm, ok := v.Actual.Pods[p.Pod.UID]
	return oe.Action{Kind: oe.OpPublish, Volume: v.Name, Pod: p, Expand: expand,
		ChangeOwnership: v.Caps.OwnershipChange && p.FSGroup != nil && !p.ReadOnly,
		Republish:       ok && (pm.State == podvol.Mounted || pm.Found && pm.State == podvol.Uncertain)}
}

// unpublishAction unpublishes the volume from pod p. A filesystem
// volume's subPath bind mounts in the pod are cleaned first, as the
// kubelet does: a leftover one (made by a runtime or a kubelet fork, or by
// an earlier run) would keep a reference to the volume's mount, and the
// unstage after the unpublish would refuse for ever. A block volume has
// none.
func unpublishAction(v View, p podvol.PodVolume) oe.Action {
	return oe.Action{Kind: oe.OpUnpublish, Volume: v.Name, Pod: p, CleanSubPaths: v.Actual.Spec.Mode != podvol.Block}
}

// refusals are the desired pods that may not use the volume now, and why.
// The SELinux check comes first, as in the kubelet (its populator refuses
// a conflicting pod before any mount); ReadWriteOncePod is then decided
// among the pods SELinux admits, so that a pod refused for its context
// never owns the volume and blocks the others.
func refusals(v View, sel seLinuxAdmission) map[types.UID]error {
	if err := lifecycleRefusal(v); err != nil {
		out := make(map[types.UID]error, len(v.Desired))
		for _, p := range v.Desired {
			out[p.Pod.UID] = fmt.Errorf("pod %s cannot use volume %s%s: %w", p.Pod, volumeName(v.Spec), claimSuffix(v.Spec), err)
		}
		return out
	}
	if len(sel.Refused) == 0 {
		return rwopRefusals(v) // nil, without allocating, for most volumes
	}
	out := make(map[types.UID]error, len(sel.Refused))
	for uid, err := range sel.Refused {
		out[uid] = err
	}
	admitted := make([]podvol.PodVolume, 0, len(v.Desired))
	for _, p := range v.Desired {
		if out[p.Pod.UID] == nil {
			admitted = append(admitted, p)
		}
	}
	v.Desired = admitted
	for uid, err := range rwopRefusals(v) {
		out[uid] = err
	}
	return out
}

// stagePod is the pod a stage is for: the first desired pod (by UID) not
// refused that has no Mounted publish yet, else the first not refused (plan
// stages only when one is not). Its fsGroup goes to a driver that applies
// it at stage; the staging is shared, and the kubelet too passes the
// fsGroup of the pod whose mount stages it.
func stagePod(v View, refused map[types.UID]error) podvol.PodVolume {
	var first *podvol.PodVolume
	for i, p := range v.Desired {
		if refused[p.Pod.UID] != nil {
			continue
		}
		if pm, ok := v.Actual.Pods[p.Pod.UID]; !ok || pm.State != podvol.Mounted {
			return p
		}
		if first == nil {
			first = &v.Desired[i]
		}
	}
	return *first
}

// expandFirst plans a pending node expansion before any further publish,
// so that no pod starts on the volume before it has its new size. With a
// pod that has the volume published it grows it there (volume_fs_resize,
// alone on the volume); with none, the first pod's publish grows it before
// the pod's mount counts as done (the kubelet's expansion while mounting).
// The other publishes wait until the expansion is over: one expansion at a
// time per volume.
func expandFirst(v View, d *Decision, add func(oe.Action), busy bool, expandTo int64, mounted *podvol.PodVolume, publish []podvol.PodVolume) {
	var a oe.Action
	if mounted != nil {
		a = oe.Action{Kind: oe.OpExpand, Volume: v.Name, Pod: *mounted}
	} else {
		a = publishAction(v, publish[0], expandTo)
		publish = publish[1:]
	}
	if busy || len(d.Actions) > 0 {
		d.wait("node expansion to %d bytes waits for the operations on the volume", expandTo)
	} else {
		add(a)
	}
	for _, p := range publish {
		d.wait("publish into pod %s waits for the node expansion to %d bytes", p.Pod.UID, expandTo)
	}
}

// unstage is the gate of every unstage, planned once no pod may have the
// device published and nothing runs on the volume: it waits while
// something holds the device (deviceHold) or a mount still references its
// staging path (stagingReferences), else it unstages.
func unstage(v View, d *Decision, add func(oe.Action)) {
	switch held, refs := deviceHold(v), stagingReferences(v); {
	case held != "":
		d.wait("unstage held: %s", held)
	case len(refs) > 0:
		d.wait("unstage waits: staging path still referenced by %v", refs)
	case len(d.Actions) == 0:
		add(oe.Action{Kind: oe.OpUnstage, Volume: v.Name})
	}
}

// stagingReferences are the mounts that still reference the staging path,
// as far as the view knows: those gathered since the last resync. Older
// ones may be gone; the unstage then planned gathers them again (it
// refuses while any is left, and its refusal says which).
func stagingReferences(v View) []string {
	if v.Refs.Resync != v.Resync {
		return nil
	}
	return v.Refs.Paths
}

// forgetBackoff decides which backoff the plan honours. After a change of
// the world (WorldChanged), every failed key of the volume is forgotten
// (Decision.ForgetBackoff) and may run at once: it failed on an older
// world. It returns the backoff left to honour.
func forgetBackoff(v View, d *Decision) map[oe.Key]*oe.BackoffEntry {
	if !v.WorldChanged || len(v.Backoff) == 0 {
		return v.Backoff
	}
	d.ForgetBackoff = make([]oe.Key, 0, len(v.Backoff))
	for k := range v.Backoff {
		d.ForgetBackoff = append(d.ForgetBackoff, k)
	}
	slices.SortFunc(d.ForgetBackoff, func(a, b oe.Key) int { return cmp.Compare(a.Pod, b.Pod) })
	return nil
}

// adopt gives a pod mount that was found on disk and trusted as Mounted
// (from nodevol's record) the desired pod's volume once that pod has been
// resolved: reconstruction only knew the directory, not the pod's name for
// the volume, its read-only flag or fsGroup. The same pod UID has the same
// (immutable) volumes, so the mount itself is what the pod wants. The
// adoptions go into d.Adopt; the view returned has them, on a copy of the
// actual pods (the caller's view is left as it was).
func adopt(v View, d *Decision) View {
	for _, p := range v.Desired {
		pm, ok := v.Actual.Pods[p.Pod.UID]
		// A reconstructed mount knows only its pod's UID.
		if !ok || pm.State != podvol.Mounted || pm.Busy || pm.Volume.Pod.Name != "" {
			continue
		}
		if len(d.Adopt) == 0 {
			v.Actual.Pods = maps.Clone(v.Actual.Pods)
		}
		d.Adopt = append(d.Adopt, p)
		pm.Volume = p
		v.Actual.Pods[p.Pod.UID] = pm
	}
	return v
}
