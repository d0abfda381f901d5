package reconciler

import (
	"errors"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volumemanager/internal/planner"
	"github.com/nodevol/nodevol/volumemanager/internal/state"
)

// noteRefusals takes in the planner's refusals of one volume: a new one
// is the refused pod's error (shown by WaitForAttachAndMount's WaitError)
// and is logged, and recorded as an event on the pod in the kubelet's
// words (refusalEvent), once; one that ended clears the pod's error, and
// its publish starts.
func (l *Loop) noteRefusals(name podvol.UniqueVolumeName, spec *podvol.VolumeSpec, rec *volumeMemo, refused []planner.Refusal) {
	old := rec.refused
	if len(refused) == 0 && len(old) == 0 {
		return
	}
	now := make(map[types.UID]planner.Refusal, len(refused))
	for _, r := range refused {
		uid := r.Pod.Pod.UID
		now[uid] = r
		if prev, ok := old[uid]; !ok || prev.Err.Error() != r.Err.Error() {
			if conflict := (*planner.SELinuxConflictError)(nil); errors.As(r.Err, &conflict) {
				l.Metrics.seLinuxConflict(spec)
			}
			l.logger.Info("Volume refused to a pod", "pod", klog.KRef(r.Pod.Pod.Namespace, r.Pod.Pod.Name), "volume", name, "err", r.Err)
			if l.Events != nil {
				ref := PodObjectRef(r.Pod.Pod)
				reason, msg := refusalEvent(spec, r)
				l.Events.Event(ref, v1.EventTypeWarning, reason, msg)
			}
		}
		// Set at every plan: a failed stage meanwhile sets every desired
		// pod's error, and the refusal is the refused pod's real cause.
		// After the event: the error ends the pod's wait (ErrFinal), whose
		// caller may look for the event at once.
		l.errs.set(uid, r.Pod.SpecName, r.Err)
	}
	for uid, r := range old {
		if _, ok := now[uid]; !ok {
			l.errs.clear(uid, r.Pod.SpecName)
		}
	}
	if len(now) == 0 {
		rec.refused = nil
	} else {
		rec.refused = now
	}
}

// countSELinuxAdmitted counts, as the kubelet does when a volume enters
// its desired state, each of a pod's resolved volumes that is not in the
// desired state yet and has a label its plugin would mount it with.
func (l *Loop) countSELinuxAdmitted(resolved []state.DesiredVolume) {
	var seen map[podvol.UniqueVolumeName]bool
	for i := range resolved {
		dv := &resolved[i]
		if !dv.SELinuxAdmitted || seen[dv.Spec.Name] {
			continue
		}
		if _, _, ok := l.DSW.Volume(dv.Spec.Name); ok {
			continue
		}
		if seen == nil {
			seen = map[podvol.UniqueVolumeName]bool{}
		}
		seen[dv.Spec.Name] = true
		l.Metrics.seLinuxAdmitted(&dv.Spec)
	}
}
