package reconciler

import (
	"context"
	"errors"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
	"github.com/nodevol/nodevol/volumemanager/internal/planner"
)

// begin records an action as in flight and starts it; e is the node
// expansion the plan that started it found due (nil: none).
func (l *Loop) begin(a oe.Action, v planner.View, e *planner.Expansion) {
	if e == nil && (a.Kind == oe.OpExpand || a.Kind == oe.OpPublish && a.Expand > 0) {
		// The planner gives an expansion's target with every action that
		// expands: one without it is the planner's bug, not started (the
		// volume is planned again at its next event).
		l.logger.Error(nil, "Operation not started: the planner gave no expansion target", "operation", a.Kind.String(), "volume", a.Volume)
		return
	}
	rec := l.vol(a.Volume)
	rec.started(a)
	in := Input{Input: oe.Input{Spec: v.Spec, PublishContext: v.Actual.PublishContext, DeviceMountPath: v.Actual.DeviceMountPath}}
	switch a.Kind {
	case oe.OpUnpublish, oe.OpUnstage:
		in.Spec = v.Actual.Spec // tear down what was set up
	case oe.OpPublish:
		delete(rec.republish, a.Pod.Pod.UID)
		l.ASW.SetPodBusy(v.Spec, a.Pod, true) // possibly mounted from now on
		if a.Expand > 0 {
			in.Expansion = *e
		}
	case oe.OpAttach:
		l.setAttachment(a.Volume, rec, l.attachmentName(&v.Spec))
	case oe.OpSelfAttach:
		// Waited for from now on, but held in the object cache only once
		// the attach returns (applyAttach): a read racing the create could
		// answer NotFound and keep that until its next poll, and a retry
		// would then create it again.
		rec.attachment = l.attachmentName(&v.Spec)
	case oe.OpStage:
		l.ASW.SetDeviceSELinuxContext(v.Spec, a.SELinuxContext) // possibly staged with it from now on
	case oe.OpSelfDetach:
		in.Spec = v.Actual.Spec
		l.setAttachment(a.Volume, rec, l.attachmentName(&in.Spec))
	case oe.OpExpand:
		in.VolumePath = v.Actual.Pods[a.Pod.Pod.UID].Path
		in.Expansion = *e
	}
	l.running.start(a, callName(l.Volumes, a, &in.Spec), l.Clock.Now())
	if (a.Kind == oe.OpStage || a.Kind == oe.OpPublish) && !v.Known && v.CapsErr == nil && !v.Caps.Attachable {
		l.Metrics.attachmentNotNeeded(&in.Spec)
	}
	if logger := l.logger.V(4); logger.Enabled() { // its arguments cost allocations even when the line is dropped
		logger.Info("Starting operation", "operation", a.Kind.NameFor(in.Spec.Mode), "volume", a.Volume, "pod", a.Pod.Pod.String())
	}
	l.Host.Start(a, in)
}

// Apply records an operation's outcome: the only writer of the actual state
// after start.
func (l *Loop) Apply(o oe.Outcome) {
	a := o.Action
	rec := l.vol(a.Volume)
	rec.ended(a)
	l.running.done(a)
	l.queue.add(a.Volume)
	defer func() {
		if rec.inflight == nil {
			rec.olderWorld = false
		}
	}()
	if o.NotRun {
		if a.Kind == oe.OpPublish {
			l.ASW.SetPodBusy(o.Spec, a.Pod, false)
		}
		return
	}
	l.Metrics.observe(o)
	if a.Pod.Pod.UID == "" {
		l.notes.setErr(a.Volume, o.Err) // once its pods are gone, no pod's error holds it
	}
	if o.Err != nil {
		l.failed(o)
		if rec.olderWorld && rec.inflight == nil {
			rec.worldChanged = true // it ran on an older world: the planner forgets its backoff
		}
	} else {
		l.succeeded(o)
	}
	switch a.Kind {
	case oe.OpAttach, oe.OpSelfAttach, oe.OpSelfDetach:
		l.applyAttach(o, rec)
	case oe.OpStage, oe.OpUnstage:
		l.applyDevice(o, rec)
	case oe.OpPublish, oe.OpUnpublish:
		l.applyPod(o, rec)
	}
	if (a.Kind == oe.OpExpand || a.Expand > 0) && o.Err == nil {
		// Grown: the node has the volume at that size. Not grown and
		// not to be asked again as it was: held (the claim's next
		// version, or the volume's next set-up, says what is due).
		if e := o.Expansion; e.Size > 0 {
			l.ASW.SetSize(a.Volume, e.Size)
		} else if e.Held > 0 {
			rec.expandHeld = planner.ExpandHold{Size: e.Held, ClaimRV: e.HeldClaim}
		}
	}
}

// succeeded forgets the key's backoff and failure log, saying so when it
// had failed before.
func (l *Loop) succeeded(o oe.Outcome) {
	a, key := o.Action, o.Action.Key()
	if prev, ok := l.backoff.Entry(key); ok && prev.Kind == a.Kind {
		pod := "" // an operation on the whole volume: no pod
		if a.Pod.Pod.Name != "" {
			pod = a.Pod.Pod.String()
		}
		l.logger.Info("Operation succeeded after failing", "operation", a.Kind.NameFor(o.Spec.Mode), "volume", a.Volume, "driver", o.Spec.Driver, "pod", pod, "failures", prev.Failures)
	}
	l.backoff.Succeeded(key)
	l.failLog.succeeded(key)
}

// applyAttach records the outcome of an attach, a self attach or a self
// detach.
func (l *Loop) applyAttach(o oe.Outcome, rec *volumeMemo) {
	spec := o.Spec
	switch o.Action.Kind {
	case oe.OpAttach:
		if o.Err == nil {
			l.ASW.MarkAttached(spec, o.PublishContext)
			l.setAttachment(o.Action.Volume, rec, "")
		}
	case oe.OpSelfAttach:
		// Whatever the outcome, the VolumeAttachment may exist now, unless
		// the volume needed none (a nil publish context).
		if o.Err != nil || o.PublishContext != nil {
			l.ASW.SetSelfAttached(spec, true)
		}
		if o.Err == nil {
			l.ASW.MarkAttached(spec, o.PublishContext)
			l.setAttachment(o.Action.Volume, rec, "")
			if o.PublishContext != nil {
				l.attachedEvents(o)
			}
		} else if rec.attachment != "" {
			l.Host.HoldAttachment(o.Action.Volume, rec.attachment) // see begin
		}
	case oe.OpSelfDetach:
		if o.Err == nil {
			l.ASW.SetSelfAttached(spec, false)
			l.setAttachment(o.Action.Volume, rec, "")
		}
	}
}

// applyDevice records the outcome of a stage or an unstage.
func (l *Loop) applyDevice(o oe.Outcome, rec *volumeMemo) {
	spec := o.Spec
	if o.Action.Kind == oe.OpStage {
		switch {
		case o.Err == nil:
			l.ASW.SetDeviceState(spec, podvol.Mounted, o.Path)
		case o.Uncertain:
			l.ASW.SetDeviceState(spec, podvol.Uncertain, o.Path)
		}
		// A final error leaves the state as it was: NotMounted stays
		// NotMounted, and an Uncertain device is not declared unmounted.
		return
	}
	var inUse *volume.InUseError
	switch {
	case o.Err == nil:
		l.ASW.SetDeviceState(spec, podvol.NotMounted, "")
		rec.refs = planner.StagingRefs{}
	case errors.As(o.Err, &inUse):
		// Nothing was done: the references it found are the planner's
		// until the next resync.
		rec.refs = planner.StagingRefs{Paths: inUse.Refs, Resync: l.resyncs}
	default:
		l.ASW.SetDeviceState(spec, podvol.Uncertain, "")
	}
}

// applyPod records the outcome of a publish or an unpublish.
func (l *Loop) applyPod(o oe.Outcome, rec *volumeMemo) {
	a, spec := o.Action, o.Spec
	if a.Kind == oe.OpPublish {
		switch {
		case o.Err == nil:
			l.mountedMetric(o)
			l.ASW.SetPodMount(spec, a.Pod, podvol.Mounted, o.Path)
			l.errs.clear(a.Pod.Pod.UID, a.Pod.SpecName)
		case o.Uncertain:
			l.ASW.SetPodMount(spec, a.Pod, podvol.Uncertain, o.Path)
		default:
			l.ASW.SetPodBusy(spec, a.Pod, false) // as it was before
		}
		return
	}
	if o.Err == nil {
		l.ASW.DeletePodMount(a.Volume, a.Pod.Pod.UID)
		delete(rec.foundMounts, a.Pod.Pod.UID)
		return
	}
	// The kubelet marks a failed unmount uncertain so it is retried and a
	// new pod publishes again (kubernetes PR #100183).
	l.ASW.SetPodMount(spec, a.Pod, podvol.Uncertain, "")
}

// failed backs the operation's key off, remembers the error for the pods it
// concerns, logs it once with the next retry time (rate-limited: faillog.go)
// and records an event in the kubelet's words (events.go).
func (l *Loop) failed(o oe.Outcome) {
	a := o.Action
	now := l.Clock.Now()
	wait := l.backoff.Failed(a.Key(), a.Kind, o.Err, now)
	var pods []podvol.PodVolume
	switch a.Kind {
	case oe.OpPublish, oe.OpUnpublish:
		pods = []podvol.PodVolume{a.Pod}
	default:
		_, pods, _ = l.DSW.Volume(a.Volume)
	}
	for _, p := range pods {
		l.errs.set(p.Pod.UID, p.SpecName, o.Err)
	}
	if errors.Is(o.Err, context.Canceled) {
		return
	}
	podNames := make([]string, 0, len(pods))
	for _, p := range pods {
		podNames = append(podNames, p.Pod.String())
	}
	if log, suppressed := l.failLog.failed(a.Key(), a.Kind, o.Err.Error(), now); log {
		kv := []any{"operation", a.Kind.NameFor(o.Spec.Mode), "volume", a.Volume, "driver", o.Spec.Driver, "pods", podNames,
			"uncertain", o.Uncertain, "retryAfter", wait, "nextRetry", now.Add(wait).UTC().Format(rfc3339Milli)}
		if suppressed > 0 {
			kv = append(kv, "suppressed", suppressed)
		}
		if errors.Is(o.Err, volume.ErrNotReady) {
			// Waiting for something that is on its way (a VolumeAttachment
			// the attacher has not attached yet, a driver not registered
			// yet) is not a failure: an info line, and no Warning event on
			// the pod, which every attach-required mount would otherwise
			// get. A wait that lasts still shows, rate-limited like a
			// failure, and its cause is in the pod's wait error.
			l.logger.Info("Volume operation waiting", append(kv, "reason", o.Err.Error())...)
			return
		}
		l.logger.Error(o.Err, "Volume operation failed", kv...)
	} else if errors.Is(o.Err, volume.ErrNotReady) {
		return
	}
	if l.Events == nil {
		return
	}
	if nodeLevel(a.Kind) {
		// No pod is left to tell: the Node is the object, as for the
		// kubelet's node-level volume problems.
		reason, msg := FailureEvent(o, podvol.PodVolume{})
		if reason == "" {
			return
		}
		ref := &v1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: l.Node, UID: types.UID(l.Node)}
		l.Events.Event(ref, v1.EventTypeWarning, reason, msg)
		return
	}
	for _, p := range pods {
		if p.Pod.Name == "" {
			continue // a mount found on disk whose pod was not added again: no object to name
		}
		reason, msg := FailureEvent(o, p)
		if reason == "" {
			return
		}
		ref := PodObjectRef(p.Pod)
		l.Events.Event(ref, v1.EventTypeWarning, reason, msg)
	}
}

// attachedEvents records a self-attach that attached the volume on its
// desired pods, as the kubelet records its own attach: Normal
// SuccessfulAttachVolume (attachedEvent).
func (l *Loop) attachedEvents(o oe.Outcome) {
	if l.Events == nil {
		return
	}
	_, pods, _ := l.DSW.Volume(o.Action.Volume)
	for _, p := range pods {
		if p.Pod.Name == "" {
			continue
		}
		ref := PodObjectRef(p.Pod)
		l.Events.Event(ref, v1.EventTypeNormal, reasonAttached, attachedEvent(o, p))
	}
}

// setAttachment records the VolumeAttachment a volume waits for ("":
// none) and, unless Config.ClusterInformers, makes the volume hold it in
// the object cache for as long as it waits.
func (l *Loop) setAttachment(name podvol.UniqueVolumeName, rec *volumeMemo, va string) {
	if rec.attachment == va {
		return
	}
	rec.attachment = va
	l.Host.HoldAttachment(name, va)
}

// mountedMetric records the end to end time of a successful publish: since
// the pod volume entered the desired state, or the publish's own time for
// a volume the pod had Mounted already (metrics.mounted).
func (l *Loop) mountedMetric(o oe.Outcome) {
	if l.Metrics == nil {
		return
	}
	a := o.Action
	took := o.Duration
	if v, ok := l.ASW.Volume(a.Volume); !ok || v.Pods[a.Pod.Pod.UID].State != podvol.Mounted {
		since, wanted := l.DSW.WantedSince(a.Volume, a.Pod.Pod.UID)
		if !wanted {
			return // the pod left meanwhile
		}
		took = l.Clock.Since(since)
	}
	l.Metrics.mounted(&o.Spec, took)
}
