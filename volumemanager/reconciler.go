package volumemanager

import (
	"context"
	"errors"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/cache"
	oe "github.com/nodevol/nodevol/operationexecutor"
)

// reconciler drives each volume from its actual state to its desired state.
// It is keyed by volume: a change to the desired state, an operation's
// outcome, a driver registration or a VolumeAttachment update enqueues the
// volumes it touches; a periodic resync enqueues all of them. A worker plans
// one volume (plan, a pure function) and hands the actions to the executor;
// each outcome is applied to the actual state and the volume is enqueued again.
type reconciler struct {
	dsw     *cache.DesiredStateOfWorld
	asw     *cache.ActualStateOfWorld
	exec    *oe.Executor
	plugin  oe.Plugin
	queue   workqueue.TypedDelayingInterface[cache.UniqueVolumeName]
	events  record.EventRecorder
	metrics *metrics
	// hold reports whether a volume's teardown must wait (a volume found on
	// disk at start, before every pod has been added); nil: never.
	hold func(cache.UniqueVolumeName) bool
	// attachGate reports whether confirming a volume's attachment must wait
	// (not reported in Node.Status.VolumesInUse yet); nil: never.
	attachGate func(name cache.UniqueVolumeName, driver string) bool
	// forgotten, if set, is called when a volume is forgotten.
	forgotten func()

	mu sync.Mutex
	// lastErr holds the last error of each pod's volume, by spec name, for
	// WaitForAttachAndMount's report.
	lastErr map[types.UID]map[string]error
}

// sync plans one volume and starts what the plan asks for.
func (r *reconciler) sync(ctx context.Context, name cache.UniqueVolumeName) {
	spec, desired, wanted := r.dsw.Volume(name)
	actual, known := r.asw.Volume(name)
	if !wanted {
		spec = actual.Spec
	}
	actions, done := plan(name, desired, spec, actual, known)
	if done {
		if known {
			r.asw.DeleteVolume(name)
			if r.forgotten != nil {
				r.forgotten()
			}
		}
		r.exec.Forget(name)
		return
	}
	if r.hold != nil && r.hold(name) {
		actions = withoutTeardown(actions)
	}
	if r.attachGate != nil && len(actions) > 0 && actions[len(actions)-1].Kind == oe.OpAttach && r.attachGate(name, spec.Driver) {
		actions = actions[:len(actions)-1] // reported in use first; the report retries the volume
	}
	for _, a := range actions {
		r.start(ctx, name, spec, actual, a, func() bool { return r.stillNeeded(a) })
	}
}

// stillNeeded reports whether a planned action is still to do: the plan
// was made from a snapshot, and an operation that finished since may have
// done the work (several pods' publishes of one volume, for example).
func (r *reconciler) stillNeeded(a oe.Action) bool {
	v, known := r.asw.Volume(a.Volume)
	switch a.Kind {
	case oe.OpAttach:
		return !known || !v.Attached
	case oe.OpStage:
		return !known || v.DeviceState != cache.Mounted
	case oe.OpPublish:
		pm, ok := v.Pods[a.Pod.Pod.UID]
		return !known || !ok || pm.State != cache.Mounted
	case oe.OpUnpublish:
		pm, ok := v.Pods[a.Pod.Pod.UID]
		return known && ok && pm.State.MayBeMounted()
	case oe.OpUnstage:
		return known && v.DeviceState.MayBeMounted()
	}
	return true
}

// start starts one action on volume name; needed, if set, is checked once
// the action's key is held (see oe.Operation.Needed).
func (r *reconciler) start(ctx context.Context, name cache.UniqueVolumeName, spec cache.VolumeSpec, actual cache.ActualVolume, a oe.Action, needed func() bool) {
	in := oe.Input{Spec: spec, PublishContext: actual.PublishContext, DeviceMountPath: actual.DeviceMountPath}
	if a.Kind == oe.OpUnpublish || a.Kind == oe.OpUnstage {
		in.Spec = actual.Spec // tear down what was set up
	}
	op := oe.NewOperation(r.plugin, a, in, r.apply, func() { r.queue.Add(name) })
	op.Needed = needed
	err := r.exec.Run(ctx, op)
	var be *oe.BackoffError
	switch {
	case err == nil, errors.Is(err, oe.ErrBusy):
		// Busy: the running operation enqueues the volume when it ends.
	case errors.As(err, &be):
		r.queue.AddAfter(name, be.RetryAfter)
	default:
		klog.FromContext(ctx).Error(err, "Cannot start operation", "volume", name, "operation", a.Kind.String())
	}
}

// withoutTeardown drops the unpublish and unstage actions.
func withoutTeardown(actions []oe.Action) []oe.Action {
	out := actions[:0:0]
	for _, a := range actions {
		if a.Kind != oe.OpUnpublish && a.Kind != oe.OpUnstage {
			out = append(out, a)
		}
	}
	return out
}

// apply records an outcome in the actual state. It runs while the
// operation's key is held, so the next plan sees it.
func (r *reconciler) apply(o oe.Outcome) {
	a, spec := o.Action, o.Spec
	r.metrics.observe(o)
	if o.Err != nil {
		r.recordError(o)
	}
	switch a.Kind {
	case oe.OpAttach:
		if o.Err == nil {
			r.asw.MarkAttached(spec, o.PublishContext)
		}
	case oe.OpStage:
		switch {
		case o.Err == nil:
			r.asw.SetDeviceState(spec, cache.Mounted, o.Path)
		case o.Uncertain:
			r.asw.SetDeviceState(spec, cache.Uncertain, o.Path)
		}
		// A final error leaves the state as it was: NotMounted stays
		// NotMounted, and an Uncertain device is not declared unmounted.
	case oe.OpUnstage:
		if o.Err == nil {
			r.asw.SetDeviceState(spec, cache.NotMounted, "")
		} else {
			r.asw.SetDeviceState(spec, cache.Uncertain, "")
		}
	case oe.OpPublish:
		switch {
		case o.Err == nil:
			r.asw.SetPodMount(spec, a.Pod, cache.Mounted, o.Path)
			r.clearError(a.Pod.Pod.UID, a.Pod.SpecName)
		case o.Uncertain:
			r.asw.SetPodMount(spec, a.Pod, cache.Uncertain, o.Path)
		}
	case oe.OpUnpublish:
		if o.Err == nil {
			r.asw.DeletePodMount(a.Volume, a.Pod.Pod.UID)
		} else {
			// The kubelet marks a failed unmount uncertain so it is retried
			// and a new pod publishes again (kubernetes PR #100183).
			r.asw.SetPodMount(spec, a.Pod, cache.Uncertain, "")
		}
	}
}

// recordError remembers an operation's error for the pods it concerns and
// sends a FailedMount event for final mount-side errors.
func (r *reconciler) recordError(o oe.Outcome) {
	var pods []cache.PodVolume
	switch o.Action.Kind {
	case oe.OpPublish, oe.OpUnpublish:
		pods = []cache.PodVolume{o.Action.Pod}
	default:
		_, pods, _ = r.dsw.Volume(o.Action.Volume)
	}
	r.mu.Lock()
	for _, p := range pods {
		m := r.lastErr[p.Pod.UID]
		if m == nil {
			m = map[string]error{}
			r.lastErr[p.Pod.UID] = m
		}
		m[p.SpecName] = o.Err
	}
	r.mu.Unlock()
	if r.events == nil || errors.Is(o.Err, context.Canceled) {
		return
	}
	reason := "FailedMount"
	switch o.Action.Kind {
	case oe.OpAttach:
		reason = "FailedAttachVolume"
	case oe.OpUnpublish, oe.OpUnstage:
		return // the kubelet sends no event for unmount errors either
	}
	for _, p := range pods {
		ref := &v1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: p.Pod.Namespace, Name: p.Pod.Name, UID: p.Pod.UID}
		r.events.Event(ref, v1.EventTypeWarning, reason, o.Err.Error())
	}
}

func (r *reconciler) clearError(uid types.UID, specName string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if m := r.lastErr[uid]; m != nil {
		delete(m, specName)
		if len(m) == 0 {
			delete(r.lastErr, uid)
		}
	}
}

func (r *reconciler) podErrors(uid types.UID) map[string]error {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]error{}
	for k, v := range r.lastErr[uid] {
		out[k] = v
	}
	return out
}

func (r *reconciler) forgetPod(uid types.UID) {
	r.mu.Lock()
	delete(r.lastErr, uid)
	r.mu.Unlock()
}

// retry drops the backoff of the volumes and plans them again at once: the
// world changed in a way that may let a failed operation succeed.
func (r *reconciler) retry(names ...cache.UniqueVolumeName) {
	for _, n := range names {
		r.exec.Forget(n)
		r.queue.Add(n)
	}
}

// worker processes volumes until the queue shuts down.
func (r *reconciler) worker(ctx context.Context) {
	for {
		name, quit := r.queue.Get()
		if quit {
			return
		}
		r.sync(ctx, name)
		r.queue.Done(name)
	}
}
