package volumemanager

import (
	"fmt"
	"sort"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/cache"
	oe "github.com/nodevol/nodevol/internal/operationexecutor"
)

// volumeView is everything the planner knows of one volume: what pods
// want, what is done, what runs, what waits and why. The loop builds it;
// plan reads nothing else.
type volumeView struct {
	Name cache.UniqueVolumeName
	// Spec is what the pods want (the desired spec), or what is set up
	// (the actual spec) when no pod wants the volume.
	Spec cache.VolumeSpec
	// Desired are the pods that want the volume, sorted by UID.
	Desired []cache.PodVolume
	// Actual is what is done; Known is false when nothing is.
	Actual cache.ActualVolume
	Known  bool
	// HeldPods are pods whose mounts must not be torn down although no
	// desired pod is them: found on disk before the pods were synced, or
	// of a pod that is added but cannot be resolved (yet).
	HeldPods map[types.UID]string
	// HoldDevice, if not empty, says why the device must not be unstaged.
	HoldDevice string
	// Refs are the mounts under the pods directory that referenced the
	// staging path when an unstage last looked; the resync clears them.
	Refs []string
	// InFlight are the operations running on the volume.
	InFlight map[oe.Key]oe.OpKind
	// Backoff is the retry state of the volume's failed keys.
	Backoff map[oe.Key]*oe.BackoffEntry
	// AttachHeld: the attachment may be confirmed only once the volume is
	// reported in the Node's volumesInUse, and it is not yet.
	AttachHeld bool
	// SelfAttach: the node attaches volumes itself (creates their
	// VolumeAttachments) instead of waiting for the attach/detach
	// controller to.
	SelfAttach bool
	// Republish are pods whose Mounted volume must be published again
	// (the driver's CSIDriver sets requiresRepublish and a resync came).
	Republish map[types.UID]bool
	// ExpandTo, if > 0, is the size the claim's pending node expansion
	// grows the volume to.
	ExpandTo int64
	// Now is the time backoff is compared with.
	Now time.Time
}

// decision is what plan returns for one volume.
type decision struct {
	// Actions are the operations to start now.
	Actions []oe.Action
	// Waiting says why something that is due does not start (empty when
	// nothing waits): for logs, scripts and wait errors.
	Waiting []string
	// Retry is the earliest time a backoff that holds an action back
	// ends; zero when none does.
	Retry time.Time
	// Done is true when nothing of the volume is left and nothing runs:
	// the loop forgets it.
	Done bool
	// Refused are desired pods that may not use the volume now: an
	// SELinux conflict (admitSELinux) or ReadWriteOncePod (rwopRefusals).
	Refused []refusal
}

func (d *decision) wait(format string, args ...any) {
	d.Waiting = append(d.Waiting, fmt.Sprintf(format, args...))
}

// plan decides what to do next for one volume. It does no I/O, reads no
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
func plan(v volumeView) decision {
	var d decision
	// Refusals first, whatever else waits: the loop reports a refusal that
	// is missing from a decision as ended.
	sel := admitSELinux(v)
	refused := refusals(v, sel)
	for _, p := range v.Desired {
		if err := refused[p.Pod.UID]; err != nil {
			d.Refused = append(d.Refused, refusal{Pod: p, Err: err})
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
		if b := v.Backoff[a.Key()]; b != nil && b.Kind == a.Kind && v.Now.Before(b.Until) {
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
		case v.HeldPods[uid] != "":
			d.wait("unpublish from pod %s held: %s", uid, v.HeldPods[uid])
		default:
			add(oe.Action{Kind: oe.OpUnpublish, Volume: v.Name, Pod: pm.Volume})
		}
	}

	if len(v.Desired) == 0 {
		switch {
		case published || busy:
			// Unstage waits for every unpublish.
		case !v.Known:
			d.Done = true
		case !v.Actual.DeviceState.MayBeMounted() && v.Actual.SelfAttached && v.HoldDevice != "":
			// An attachment found at start waits for the pods, as a device
			// found on disk does.
			d.wait("detach held: %s", v.HoldDevice)
		case !v.Actual.DeviceState.MayBeMounted() && v.Actual.SelfAttached:
			// Detach last: the VolumeAttachment the node created goes
			// only once the device is unstaged.
			add(oe.Action{Kind: oe.OpSelfDetach, Volume: v.Name})
		case !v.Actual.DeviceState.MayBeMounted():
			d.Done = true
		case v.HoldDevice != "":
			d.wait("unstage held: %s", v.HoldDevice)
		case len(v.Refs) > 0:
			d.wait("unstage waits: staging path still referenced by %v", v.Refs)
		case len(d.Actions) == 0:
			add(oe.Action{Kind: oe.OpUnstage, Volume: v.Name})
		}
		return d
	}

	if len(d.Refused) == len(v.Desired) {
		return d // no pod may use it yet: nothing to set up
	}

	if !v.Spec.Ephemeral {
		// A whole-volume operation runs alone: not beside one in flight,
		// nor beside an unpublish planned above.
		volumeOp := func(a oe.Action) decision {
			if !busy && len(d.Actions) == 0 {
				add(a)
			}
			return d
		}
		if !v.Known || !v.Actual.Attached {
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
		if v.Actual.DeviceState.MayBeMounted() && !sel.Mounted && v.Actual.SELinuxContext != sel.Context {
			// Staged with an SELinux context that no pod wanting it has
			// (its pods are gone): unstage, then stage with the new one.
			switch {
			case published || busy:
				d.wait("unstage (to stage again with SELinux context %q) waits for the unpublishes", sel.Context)
			case v.HoldDevice != "":
				d.wait("unstage held: %s", v.HoldDevice)
			case len(v.Refs) > 0:
				d.wait("unstage waits: staging path still referenced by %v", v.Refs)
			default:
				return volumeOp(oe.Action{Kind: oe.OpUnstage, Volume: v.Name})
			}
			return d
		}
		if v.Actual.DeviceState != cache.Mounted {
			// NotMounted, or Uncertain: staging again is safe (NodeStage is idempotent).
			return volumeOp(oe.Action{Kind: oe.OpStage, Volume: v.Name, SELinuxContext: sel.Context, Pod: stagePod(v, refused)})
		}
	}
	var mounted *cache.PodVolume
	var publish []cache.PodVolume
	for i, p := range v.Desired {
		if podBusy(p.Pod.UID) || refused[p.Pod.UID] != nil {
			continue
		}
		pm, ok := v.Actual.Pods[p.Pod.UID]
		switch {
		case !ok || pm.State != cache.Mounted || v.Republish[p.Pod.UID]:
			publish = append(publish, p)
		case mounted == nil:
			mounted = &v.Desired[i]
		}
	}
	if v.ExpandTo > 0 && (mounted != nil || len(publish) > 0) {
		expandFirst(v, &d, add, busy, mounted, publish)
		return d
	}
	for _, p := range publish {
		add(oe.Action{Kind: oe.OpPublish, Volume: v.Name, Pod: p})
	}
	return d
}

// refusals are the desired pods that may not use the volume now, and why.
// The SELinux check comes first, as in the kubelet (its populator refuses
// a conflicting pod before any mount); ReadWriteOncePod is then decided
// among the pods SELinux admits, so that a pod refused for its context
// never owns the volume and blocks the others.
func refusals(v volumeView, sel seLinuxAdmission) map[types.UID]error {
	if len(sel.Refused) == 0 {
		return rwopRefusals(v) // nil, without allocating, for most volumes
	}
	out := make(map[types.UID]error, len(sel.Refused))
	for uid, err := range sel.Refused {
		out[uid] = err
	}
	admitted := make([]cache.PodVolume, 0, len(v.Desired))
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
func stagePod(v volumeView, refused map[types.UID]error) cache.PodVolume {
	var first *cache.PodVolume
	for i, p := range v.Desired {
		if refused[p.Pod.UID] != nil {
			continue
		}
		if pm, ok := v.Actual.Pods[p.Pod.UID]; !ok || pm.State != cache.Mounted {
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
func expandFirst(v volumeView, d *decision, add func(oe.Action), busy bool, mounted *cache.PodVolume, publish []cache.PodVolume) {
	var a oe.Action
	if mounted != nil {
		a = oe.Action{Kind: oe.OpExpand, Volume: v.Name, Pod: *mounted}
	} else {
		a = oe.Action{Kind: oe.OpPublish, Volume: v.Name, Pod: publish[0], Expand: v.ExpandTo}
		publish = publish[1:]
	}
	if busy || len(d.Actions) > 0 {
		d.wait("node expansion to %d bytes waits for the operations on the volume", v.ExpandTo)
	} else {
		add(a)
	}
	for _, p := range publish {
		d.wait("publish into pod %s waits for the node expansion to %d bytes", p.Pod.UID, v.ExpandTo)
	}
}
