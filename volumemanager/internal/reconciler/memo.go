package reconciler

import (
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/nodevol/nodevol/internal/duequeue"
	"github.com/nodevol/nodevol/podvol"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
	"github.com/nodevol/nodevol/volumemanager/internal/planner"
)

// volumeMemo is what the loop keeps of one volume beside the caches:
// the facts the planner's view needs that the caches do not hold, and what
// the loop must remember of the planner's last decision. The loop creates
// it when it first notes something of the volume and drops it when the
// volume is forgotten with nothing left in it.
type volumeMemo struct {
	// inflight are the operations running on the volume; nil when none.
	inflight map[oe.Key]oe.OpKind
	// foundMounts (the pods whose mounts were) and foundDevice were found
	// on disk at start; their teardown waits for the pods to be synced.
	foundMounts map[types.UID]bool
	foundDevice bool
	// refs are the mounts that referenced the staging path when an
	// unstage last looked.
	refs planner.StagingRefs
	// republish are the pods whose Mounted volume is to be published
	// again (requiresRepublish).
	republish map[types.UID]bool
	// expandHeld is the node expansion not to be asked again
	// (oe.ExpandResult.Held).
	expandHeld planner.ExpandHold
	// attachment is the VolumeAttachment the volume's attach (or detach)
	// waits for; "" when none.
	attachment string
	// worldChanged: the world changed since the volume's backoff was
	// recorded (planner.View.WorldChanged). olderWorld: operations were in
	// flight when it did, so their failures ran on an older world too.
	worldChanged, olderWorld bool
	// waiting says why the volume's due work waits (the planner's words).
	waiting []string
	// refused are the pods refused the volume now (refusals.go).
	refused map[types.UID]planner.Refusal
	// notReady is why the volume last waited for its capabilities
	// (planner.Decision.NotReady), "" when it did not.
	notReady string
}

// noteNotReady takes in the planner's word that a wanted volume waits
// because what it needs is not known yet (its driver is not registered):
// it is every desired pod's error, as the error of an operation that
// failed "not ready" is, with no event; it is logged when it changes. The
// pods' errors clear when their publish succeeds.
func (l *Loop) noteNotReady(name podvol.UniqueVolumeName, rec *volumeMemo, desired []podvol.PodVolume, err error) {
	if err == nil {
		rec.notReady = ""
		return
	}
	if why := err.Error(); why != rec.notReady {
		rec.notReady = why
		l.logger.Info("Volume waiting", "volume", name, "reason", why)
	}
	for _, p := range desired {
		l.errs.set(p.Pod.UID, p.SpecName, err)
	}
}

// vol returns the volume's memo, creating it when missing.
func (l *Loop) vol(name podvol.UniqueVolumeName) *volumeMemo {
	rec := l.vols[name]
	if rec == nil {
		rec = &volumeMemo{}
		l.vols[name] = rec
	}
	return rec
}

// WaitingOf says why the volume's due work waits, as the planner last said.
func (l *Loop) WaitingOf(name podvol.UniqueVolumeName) []string {
	if rec := l.vols[name]; rec != nil {
		return rec.waiting
	}
	return nil
}

func (r *volumeMemo) foundMount(uid types.UID) {
	if r.foundMounts == nil {
		r.foundMounts = map[types.UID]bool{}
	}
	r.foundMounts[uid] = true
}

func (r *volumeMemo) markRepublish(uid types.UID) {
	if r.republish == nil {
		r.republish = map[types.UID]bool{}
	}
	r.republish[uid] = true
}

// started records an operation as in flight.
func (r *volumeMemo) started(a oe.Action) {
	if r.inflight == nil {
		r.inflight = map[oe.Key]oe.OpKind{}
	}
	r.inflight[a.Key()] = a.Kind
}

// ended records an operation as no longer in flight.
func (r *volumeMemo) ended(a oe.Action) {
	delete(r.inflight, a.Key())
	if len(r.inflight) == 0 {
		r.inflight = nil
	}
}

// forget drops what the loop keeps of a volume that is gone: what it
// learnt of the disk and the planner's last words. What holds it (found
// on disk), runs, or waits to be published again stays.
func (r *volumeMemo) forget() {
	r.refs = planner.StagingRefs{}
	r.waiting = nil
	r.olderWorld = false
	r.attachment = ""
	r.expandHeld = planner.ExpandHold{}
}

// empty reports whether the memo keeps nothing.
func (r *volumeMemo) empty() bool {
	return r.inflight == nil && len(r.foundMounts) == 0 && !r.foundDevice && len(r.refs.Paths) == 0 &&
		len(r.republish) == 0 && r.expandHeld == (planner.ExpandHold{}) && r.attachment == "" &&
		!r.worldChanged && !r.olderWorld && len(r.waiting) == 0 && len(r.refused) == 0
}

// volumeQueue is what the loop plans next: the volumes due now (dirty)
// and when each one backing off is due (retries, which also wake Run's
// select at the earliest).
type volumeQueue struct {
	dirty   map[podvol.UniqueVolumeName]struct{}
	retries *duequeue.Queue[podvol.UniqueVolumeName]
}

func newVolumeQueue(c clock.Clock) volumeQueue {
	return volumeQueue{dirty: map[podvol.UniqueVolumeName]struct{}{}, retries: duequeue.New[podvol.UniqueVolumeName](c)}
}

// add makes a volume due now.
func (q *volumeQueue) add(name podvol.UniqueVolumeName) { q.dirty[name] = struct{}{} }

func (q *volumeQueue) len() int { return len(q.dirty) }

// take returns the volumes due now in name order, and empties the queue:
// the same events start the same operations in the same order (logs and
// scenario scripts read the same).
func (q *volumeQueue) take() []podvol.UniqueVolumeName {
	names := make([]podvol.UniqueVolumeName, 0, len(q.dirty))
	for name := range q.dirty {
		names = append(names, name)
	}
	slices.Sort(names)
	q.dirty = map[podvol.UniqueVolumeName]struct{}{}
	return names
}

// retryAt makes a volume due at t, when its earliest backoff ends; a zero
// t: none does.
func (q *volumeQueue) retryAt(name podvol.UniqueVolumeName, t time.Time) { q.retries.Set(name, t) }

// due makes the volumes whose backoff has ended due now; the others stay
// in retries, whose wake-up Run arms for the earliest.
func (q *volumeQueue) due() {
	for _, name := range q.retries.PopDue() {
		q.add(name)
	}
}
