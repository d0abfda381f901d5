package volumemanager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/nodevol/nodevol/cache"
	"github.com/nodevol/nodevol/csiplugin"
	oe "github.com/nodevol/nodevol/internal/operationexecutor"
	"github.com/nodevol/nodevol/volume"
)

// loop owns the actual state of the world. Everything that changes it
// arrives as an event: a batch from the inbox (pods, claims, drivers,
// retries), an operation's outcome, the backoff timer, the resync tick.
// After each event the loop resolves the pods that changed into the
// desired state, builds a view of each volume that changed and asks the
// planner what to do; it starts what the planner returns. Nothing else
// writes the actual state, and nothing else decides.
//
// Run drives it with goroutines; the scenario scripts drive it step by
// step (process, apply) with a fake clock and a recording start.
type loop struct {
	node       string
	clock      clock.Clock
	in         *inbox
	resolver   *resolver
	csiDrivers storagelisters.CSIDriverLister
	dsw        *cache.DesiredStateOfWorld
	asw        *cache.ActualStateOfWorld
	errs       *podErrors
	// running mirrors inflight, with start times, for the wait errors.
	running *runningOps
	metrics *metrics
	events  record.EventRecorder
	logger  klog.Logger
	// attachHeld reports whether a volume's attachment must wait to be
	// reported in use; nil: never.
	attachHeld func(name cache.UniqueVolumeName, driver string) bool
	// expansion returns the pending node expansion of a PV's claim; nil:
	// the plugin cannot expand.
	expansion func(pvName string) (expansion, bool)
	// forgotten is called when a volume is forgotten.
	forgotten func()
	// start starts an operation; its outcome comes back through apply.
	start func(a oe.Action, in opInput)
	// synced, if set, is called once the loop has taken in that the
	// informers have synced.
	synced func()
	// selfAttach: the node creates and deletes VolumeAttachments itself
	// (Config.SelfAttach).
	selfAttach bool
	// ownAttachments lists the VolumeAttachments, to find at start the
	// node's own whose volumes left nothing on disk (adoptAttachments);
	// nil: none are looked for.
	ownAttachments storagelisters.VolumeAttachmentLister
	// resolveAll resolves every known pod again at each resync, not only
	// the unresolved ones (node-restricted mode: the reads keep the
	// pods' claims and volumes in the fetcher's cache).
	resolveAll bool

	informersSynced bool
	podsSynced      bool
	// known are the pods added and not deleted, as last taken from the inbox.
	known map[types.UID]cache.PodRef
	// unresolved says why a known pod is not (fully) in the desired state.
	unresolved map[types.UID]string
	// pending maps "namespace/claim" to the pods waiting for it.
	pending map[string]map[types.UID]struct{}
	// foundMounts and foundDevices were found on disk at start; their
	// teardown waits for the pods to be synced.
	foundMounts  map[oe.Key]bool
	foundDevices map[cache.UniqueVolumeName]bool
	// unreadable are pod volume directories whose vol_data.json could not
	// be read, by the name (a PV's) they are under.
	unreadable map[string]string
	// retake removes an unreadable pod volume directory that can no longer
	// hold data (what made it unreadable is gone), reporting whether it
	// did; nil: none is removed while running.
	retake    func(dir string) bool
	inflight  map[cache.UniqueVolumeName]map[oe.Key]oe.OpKind
	backoff   *oe.Backoff
	refs      map[cache.UniqueVolumeName][]string
	republish map[oe.Key]bool
	// expanding is the size of each expansion in flight; expanded the
	// size each volume was last expanded to, until the claim's status
	// says so too.
	expanding, expanded map[cache.UniqueVolumeName]int64
	dirty               map[cache.UniqueVolumeName]struct{}
	// attaching maps the VolumeAttachment name each volume whose
	// attachment is being confirmed waits for to the volume.
	attaching map[string]cache.UniqueVolumeName
	// changed are volumes in flight when the world changed for them (a
	// VolumeAttachment update, a driver registration): their outcome, if
	// a failure, is retried at once, not after a backoff.
	changed map[cache.UniqueVolumeName]bool
	// retryAt is when each volume's earliest backoff ends.
	retryAt map[cache.UniqueVolumeName]time.Time
	// waiting says why each volume's due work waits (the planner's words).
	waiting map[cache.UniqueVolumeName][]string
	// refused are the pods refused each volume now (rwop.go).
	refused map[cache.UniqueVolumeName]map[types.UID]refusal
	// pendingSince is when each pod volume's claim was first seen missing
	// or not bound (final.go).
	pendingSince map[types.UID]map[string]time.Time
	// failLog rate-limits the failure lines (faillog.go).
	failLog *failureLog
}

// opInput is what an operation needs.
type opInput struct {
	oe.Input
	// VolumePath is where a pod has the volume published (expansion).
	VolumePath string
	// Expansion is an expansion's target.
	Expansion expansion
}

// expansion is a claim's pending node expansion.
type expansion struct {
	Size      int64
	Namespace string
	Claim     string
	PV        string
}

func newLoop(l loop) *loop {
	l.known = map[types.UID]cache.PodRef{}
	l.unresolved = map[types.UID]string{}
	l.pending = map[string]map[types.UID]struct{}{}
	l.foundMounts = map[oe.Key]bool{}
	l.foundDevices = map[cache.UniqueVolumeName]bool{}
	l.unreadable = map[string]string{}
	l.inflight = map[cache.UniqueVolumeName]map[oe.Key]oe.OpKind{}
	l.refs = map[cache.UniqueVolumeName][]string{}
	l.republish = map[oe.Key]bool{}
	l.expanding = map[cache.UniqueVolumeName]int64{}
	l.expanded = map[cache.UniqueVolumeName]int64{}
	l.dirty = map[cache.UniqueVolumeName]struct{}{}
	l.changed = map[cache.UniqueVolumeName]bool{}
	l.attaching = map[string]cache.UniqueVolumeName{}
	l.retryAt = map[cache.UniqueVolumeName]time.Time{}
	l.waiting = map[cache.UniqueVolumeName][]string{}
	if l.backoff == nil {
		l.backoff = oe.NewBackoff(oe.BackoffOptions{})
	}
	if l.errs == nil {
		l.errs = &podErrors{}
	}
	if l.running == nil {
		l.running = &runningOps{}
	}
	if l.failLog == nil {
		l.failLog = newFailureLog(failureLogBurst, failureLogInterval)
	}
	return &l
}

// install makes what reconstruction found the initial actual state.
func (l *loop) install(d diskState) {
	l.metrics.reconstructed(d)
	for _, m := range d.mounts {
		l.asw.SetPodMount(m.spec, m.vol, m.state, m.path)
		l.foundMounts[oe.Key{Volume: m.spec.Name, Pod: m.vol.Pod.UID}] = true
		l.dirty[m.spec.Name] = struct{}{}
	}
	for _, dev := range d.devices {
		l.asw.SetDeviceState(dev.spec, dev.state, dev.path)
		l.asw.SetDeviceSELinuxContext(dev.spec, dev.seLinuxContext)
		l.foundDevices[dev.spec.Name] = true
		l.dirty[dev.spec.Name] = struct{}{}
	}
	for _, dir := range d.unreadable {
		l.unreadable[filepath.Base(dir)] = dir
	}
	if l.selfAttach {
		// An earlier run may have created their VolumeAttachments: each is
		// deleted once its volume is torn down (a missing one costs a GET).
		for _, n := range l.asw.VolumeNames() {
			if v, ok := l.asw.Volume(n); ok && !v.Spec.Ephemeral {
				l.asw.SetSelfAttached(v.Spec, true)
			}
		}
	}
}

// process takes the inbox, resolves the pods that changed and plans every
// volume that changed.
func (l *loop) process(ctx context.Context) {
	b := l.in.take()
	if b.informersSynced && !l.informersSynced {
		l.informersSynced = true
		l.adoptAttachments()
		if l.synced != nil {
			l.synced()
		}
		for uid := range l.known { // resolved now that the listers are complete
			if _, ok := b.pods[uid]; !ok {
				b.pods = addPod(b.pods, uid, l.in)
			}
		}
	}
	for name := range b.drivers {
		for _, n := range l.dsw.VolumesOfDriver(name) {
			l.retry(n)
		}
		for _, n := range l.asw.VolumeNames() {
			if v, ok := l.asw.Volume(n); ok && v.Spec.Driver == name {
				l.retry(n)
			}
		}
	}
	for n := range b.volumes {
		l.retry(n)
	}
	for va := range b.attachments {
		if n, ok := l.attaching[va]; ok {
			l.retry(n)
		}
	}
	for key := range b.claims {
		for uid := range l.pending[key] {
			if _, ok := b.pods[uid]; !ok {
				b.pods = addPod(b.pods, uid, l.in)
			}
		}
		l.claimChanged(key)
	}
	for uid, pod := range b.pods {
		l.syncPod(uid, pod)
	}
	if b.podsSynced && l.informersSynced && !l.podsSynced {
		// Every pod added before MarkPodsSynced is in this batch or an
		// earlier one, and has been resolved above (or failed to be, and
		// holds its own mounts): the hold of what was found on disk
		// lifts only now.
		l.podsSynced = true
		for k := range l.foundMounts {
			l.dirty[k.Volume] = struct{}{}
		}
		for n := range l.foundDevices {
			l.dirty[n] = struct{}{}
		}
		l.foundMounts, l.foundDevices = map[oe.Key]bool{}, map[cache.UniqueVolumeName]bool{}
		l.logger.V(2).Info("Pods synced: volumes found on disk may be torn down once no resolved pod wants them")
	}
	l.planDirty(ctx)
}

func addPod(pods map[types.UID]*v1.Pod, uid types.UID, in *inbox) map[types.UID]*v1.Pod {
	if pods == nil {
		pods = map[types.UID]*v1.Pod{}
	}
	in.mu.Lock()
	pods[uid] = in.pods[uid].pod()
	in.mu.Unlock()
	return pods
}

// claimChanged plans the volume of a changed claim again (its node
// expansion may be due).
func (l *loop) claimChanged(key string) {
	if l.expansion == nil {
		return
	}
	ns, name, _ := cutKey(key)
	pvc, err := l.resolver.pvcs.PersistentVolumeClaims(ns).Get(name)
	if err != nil || pvc.Spec.VolumeName == "" {
		return
	}
	if n, ok := l.dsw.VolumeForPV(pvc.Spec.VolumeName); ok {
		l.dirty[n] = struct{}{}
	}
}

// syncPod puts a pod into the desired state, or takes it out (pod nil).
func (l *loop) syncPod(uid types.UID, pod *v1.Pod) {
	if pod == nil {
		delete(l.known, uid)
		delete(l.unresolved, uid)
		l.setPending(uid, nil)
		l.stampPending(uid, nil)
		l.errs.forget(uid)
		l.dsw.DeletePod(uid) // notifies the volumes it touched
		l.dirtyPodMounts(uid)
		return
	}
	ref := podRef(pod)
	l.known[uid] = ref
	if !l.informersSynced {
		l.unresolved[uid] = "waiting for the informers to list PVCs, PVs and CSIDrivers"
		l.dirtyPodMounts(uid)
		return
	}
	ref, wanted, resolved, errs := l.resolver.resolvePod(pod)
	l.stampPending(uid, errs)
	l.dsw.SetPod(ref, wanted, resolved, errs)
	l.errs.wake(uid) // its waiters judge the new errors (final or not)
	l.setPending(uid, waitingClaims(pod, errs))
	if len(errs) == 0 {
		delete(l.unresolved, uid)
	} else {
		names := make([]string, 0, len(errs))
		for name, err := range errs {
			names = append(names, name)
			l.logger.V(2).Info("Cannot resolve volume yet", "pod", klog.KObj(pod), "volume", name, "err", err)
		}
		sort.Strings(names)
		l.unresolved[uid] = fmt.Sprintf("pod %s cannot be resolved yet (volume %q: %v)", ref, names[0], errs[names[0]])
	}
	l.dirtyPodMounts(uid)
}

// dirtyPodMounts plans again every volume the pod may have mounted: its
// hold may have changed.
func (l *loop) dirtyPodMounts(uid types.UID) {
	for _, v := range l.asw.PodVolumes(uid) {
		l.dirty[v.Name] = struct{}{}
	}
}

// setPending records the claims a pod waits for.
func (l *loop) setPending(uid types.UID, claims []string) {
	for key, pods := range l.pending {
		delete(pods, uid)
		if len(pods) == 0 {
			delete(l.pending, key)
		}
	}
	for _, key := range claims {
		if l.pending[key] == nil {
			l.pending[key] = map[types.UID]struct{}{}
		}
		l.pending[key][uid] = struct{}{}
	}
}

// retry forgets a volume's backoff and plans it again.
func (l *loop) retry(name cache.UniqueVolumeName) {
	l.backoff.ForgetVolume(name)
	l.dirty[name] = struct{}{}
	if l.inflight[name] != nil {
		l.changed[name] = true
	}
}

// markDirty is the desired state's notification: a volume's pods changed.
func (l *loop) markDirty(name cache.UniqueVolumeName) { l.dirty[name] = struct{}{} }

// planDirty plans every dirty volume and starts what the plans say.
func (l *loop) planDirty(ctx context.Context) {
	for len(l.dirty) > 0 {
		// In name order: the same events start the same operations in
		// the same order (logs and scenario scripts read the same).
		names := make([]cache.UniqueVolumeName, 0, len(l.dirty))
		for name := range l.dirty {
			names = append(names, name)
		}
		slices.Sort(names)
		l.dirty = map[cache.UniqueVolumeName]struct{}{}
		for _, name := range names {
			l.planVolume(ctx, name)
		}
	}
}

func (l *loop) planVolume(ctx context.Context, name cache.UniqueVolumeName) {
	v := l.view(name)
	l.adopt(&v)
	d := plan(v)
	l.noteRefusals(name, d.Refused)
	if d.Retry.IsZero() {
		delete(l.retryAt, name)
	} else {
		l.retryAt[name] = d.Retry
	}
	if len(d.Waiting) > 0 {
		l.waiting[name] = d.Waiting
	} else {
		delete(l.waiting, name)
	}
	if d.Done {
		if v.Known {
			l.asw.DeleteVolume(name)
			if l.forgotten != nil {
				l.forgotten()
			}
		}
		l.forget(name)
		return
	}
	for _, a := range d.Actions {
		l.begin(a, v)
	}
}

// adopt gives a pod mount that was found on disk and trusted as Mounted
// (from nodevol's record) the desired pod's volume once that pod has been
// resolved: reconstruction only knew the directory, not the pod's name for
// the volume, its read-only flag or fsGroup. The same pod UID has the same
// (immutable) volumes, so the mount itself is what the pod wants. It works
// on the view already read, and updates it with the actual state.
func (l *loop) adopt(v *volumeView) {
	for _, p := range v.Desired {
		pm, ok := v.Actual.Pods[p.Pod.UID]
		// A reconstructed mount knows only its pod's UID.
		if ok && pm.State == cache.Mounted && !pm.Busy && pm.Volume.Pod.Name == "" {
			l.asw.SetPodMount(v.Spec, p, cache.Mounted, "")
			pm.Volume = p
			v.Actual.Pods[p.Pod.UID] = pm
		}
	}
}

// forget drops everything the loop keeps of a volume.
func (l *loop) forget(name cache.UniqueVolumeName) {
	l.backoff.ForgetVolume(name)
	l.failLog.forgetVolume(name)
	delete(l.refs, name)
	delete(l.retryAt, name)
	delete(l.waiting, name)
	delete(l.expanded, name)
	delete(l.changed, name)
	for va, n := range l.attaching {
		if n == name {
			delete(l.attaching, va)
		}
	}
}

// view gathers what the planner needs of one volume.
func (l *loop) view(name cache.UniqueVolumeName) volumeView {
	spec, desired, wanted := l.dsw.Volume(name)
	actual, known := l.asw.Volume(name)
	if !wanted {
		spec = actual.Spec
	}
	v := volumeView{
		Name: name, Spec: spec, Desired: desired, Actual: actual, Known: known,
		InFlight: l.inflight[name], Backoff: l.backoff.Volume(name), Refs: l.refs[name], Now: l.clock.Now(),
		SelfAttach: l.selfAttach,
	}
	for uid := range actual.Pods {
		if why := l.podHold(name, uid); why != "" {
			if v.HeldPods == nil {
				v.HeldPods = map[types.UID]string{}
			}
			v.HeldPods[uid] = why
		}
	}
	switch {
	case !l.podsSynced && l.foundDevices[name]:
		v.HoldDevice = "found on disk at start; kept until every pod added before MarkPodsSynced has been resolved"
	case spec.PVName != "" && l.unreadable[spec.PVName] != "":
		v.HoldDevice = fmt.Sprintf("pod volume directory %s could not be read and may use it", l.unreadable[spec.PVName])
	}
	if wanted && l.attachHeld != nil && !actual.Attached {
		v.AttachHeld = l.attachHeld(name, spec.Driver)
	}
	for _, p := range desired {
		if l.republish[oe.Key{Volume: name, Pod: p.Pod.UID}] {
			if v.Republish == nil {
				v.Republish = map[types.UID]bool{}
			}
			v.Republish[p.Pod.UID] = true
		}
	}
	if wanted && known && l.expansion != nil && spec.PVName != "" && actual.DeviceState == cache.Mounted {
		if e, ok := l.expansion(spec.PVName); ok && e.Size > l.expanded[name] {
			v.ExpandTo = e.Size
		}
	}
	return v
}

// podHold says why a pod's mount of a volume must not be torn down, or "".
func (l *loop) podHold(name cache.UniqueVolumeName, uid types.UID) string {
	if why := l.unresolved[uid]; why != "" {
		return why
	}
	if _, ok := l.known[uid]; !ok && !l.podsSynced && l.foundMounts[oe.Key{Volume: name, Pod: uid}] {
		return "found on disk at start; kept until every pod added before MarkPodsSynced has been resolved"
	}
	return ""
}

// begin records an action as in flight and starts it.
func (l *loop) begin(a oe.Action, v volumeView) {
	key := a.Key()
	if l.inflight[a.Volume] == nil {
		l.inflight[a.Volume] = map[oe.Key]oe.OpKind{}
	}
	l.inflight[a.Volume][key] = a.Kind
	l.running.start(a, v.Spec.Mode, l.clock.Now())
	in := opInput{Input: oe.Input{Spec: v.Spec, PublishContext: v.Actual.PublishContext, DeviceMountPath: v.Actual.DeviceMountPath}}
	switch a.Kind {
	case oe.OpUnpublish, oe.OpUnstage:
		in.Spec = v.Actual.Spec // tear down what was set up
	case oe.OpPublish:
		delete(l.republish, key)
		l.asw.SetPodBusy(v.Spec, a.Pod, true) // possibly mounted from now on
		if a.Expand > 0 {
			in.Expansion, _ = l.expansion(v.Spec.PVName)
			l.expanding[a.Volume] = in.Expansion.Size
		}
	case oe.OpAttach, oe.OpSelfAttach:
		l.attaching[csiplugin.AttachmentName(v.Spec.VolumeHandle, v.Spec.Driver, l.node)] = a.Volume
	case oe.OpStage:
		l.asw.SetDeviceSELinuxContext(v.Spec, a.SELinuxContext) // possibly staged with it from now on
	case oe.OpSelfDetach:
		in.Spec = v.Actual.Spec
		l.attaching[csiplugin.AttachmentName(in.Spec.VolumeHandle, in.Spec.Driver, l.node)] = a.Volume
	case oe.OpExpand:
		in.VolumePath = v.Actual.Pods[a.Pod.Pod.UID].Path
		in.Expansion, _ = l.expansion(v.Spec.PVName)
		l.expanding[a.Volume] = in.Expansion.Size
	}
	l.logger.V(4).Info("Starting operation", "operation", a.Kind.NameFor(in.Spec.Mode), "volume", a.Volume, "pod", a.Pod.Pod.String())
	l.start(a, in)
}

// apply records an operation's outcome: the only writer of the actual state
// after start.
func (l *loop) apply(o oe.Outcome) {
	a, spec := o.Action, o.Spec
	key := a.Key()
	if ops := l.inflight[a.Volume]; ops != nil {
		delete(ops, key)
		if len(ops) == 0 {
			delete(l.inflight, a.Volume)
		}
	}
	l.running.done(a)
	l.dirty[a.Volume] = struct{}{}
	defer func() {
		if l.inflight[a.Volume] == nil {
			delete(l.changed, a.Volume)
		}
	}()
	if o.NotRun {
		if a.Kind == oe.OpPublish {
			l.asw.SetPodBusy(spec, a.Pod, false)
		}
		return
	}
	l.metrics.observe(o)
	if o.Err != nil {
		l.failed(o)
		if l.changed[a.Volume] && l.inflight[a.Volume] == nil {
			l.backoff.ForgetVolume(a.Volume) // it ran on an older world
		}
	} else {
		if prev, ok := l.backoff.Entry(key); ok && prev.Kind == a.Kind {
			pod := "" // an operation on the whole volume: no pod
			if a.Pod.Pod.Name != "" {
				pod = a.Pod.Pod.String()
			}
			l.logger.Info("Operation succeeded after failing", "operation", a.Kind.NameFor(spec.Mode), "volume", a.Volume, "driver", spec.Driver, "pod", pod, "failures", prev.Failures)
		}
		l.backoff.Succeeded(key)
		l.failLog.succeeded(key)
	}
	switch a.Kind {
	case oe.OpAttach:
		if o.Err == nil {
			l.asw.MarkAttached(spec, o.PublishContext)
			delete(l.attaching, csiplugin.AttachmentName(spec.VolumeHandle, spec.Driver, l.node))
		}
	case oe.OpSelfAttach:
		// Whatever the outcome, the VolumeAttachment may exist now, unless
		// the volume needed none (a nil publish context).
		if o.Err != nil || o.PublishContext != nil {
			l.asw.SetSelfAttached(spec, true)
		}
		if o.Err == nil {
			l.asw.MarkAttached(spec, o.PublishContext)
			delete(l.attaching, csiplugin.AttachmentName(spec.VolumeHandle, spec.Driver, l.node))
		}
	case oe.OpSelfDetach:
		if o.Err == nil {
			l.asw.SetSelfAttached(spec, false)
			delete(l.attaching, csiplugin.AttachmentName(spec.VolumeHandle, spec.Driver, l.node))
		}
	case oe.OpStage:
		switch {
		case o.Err == nil:
			l.asw.SetDeviceState(spec, cache.Mounted, o.Path)
		case o.Uncertain:
			l.asw.SetDeviceState(spec, cache.Uncertain, o.Path)
		}
		// A final error leaves the state as it was: NotMounted stays
		// NotMounted, and an Uncertain device is not declared unmounted.
	case oe.OpUnstage:
		var inUse *volume.InUseError
		switch {
		case o.Err == nil:
			l.asw.SetDeviceState(spec, cache.NotMounted, "")
			delete(l.refs, a.Volume)
		case errors.As(o.Err, &inUse):
			l.refs[a.Volume] = inUse.Refs // nothing was done; the resync looks again
		default:
			l.asw.SetDeviceState(spec, cache.Uncertain, "")
		}
	case oe.OpPublish:
		switch {
		case o.Err == nil:
			l.asw.SetPodMount(spec, a.Pod, cache.Mounted, o.Path)
			l.errs.clear(a.Pod.Pod.UID, a.Pod.SpecName)
		case o.Uncertain:
			l.asw.SetPodMount(spec, a.Pod, cache.Uncertain, o.Path)
		default:
			l.asw.SetPodBusy(spec, a.Pod, false) // as it was before
		}
	case oe.OpUnpublish:
		if o.Err == nil {
			l.asw.DeletePodMount(a.Volume, a.Pod.Pod.UID)
			delete(l.foundMounts, key)
		} else {
			// The kubelet marks a failed unmount uncertain so it is retried
			// and a new pod publishes again (kubernetes PR #100183).
			l.asw.SetPodMount(spec, a.Pod, cache.Uncertain, "")
		}
	}
	if a.Kind == oe.OpExpand || a.Expand > 0 {
		// Done or refused for good: not asked again at that size (the
		// claim's status says so too, once the informer has it).
		if o.Err == nil {
			l.expanded[a.Volume] = l.expanding[a.Volume]
		}
		delete(l.expanding, a.Volume)
	}
}

// failed backs the operation's key off, remembers the error for the pods it
// concerns, logs it once with the next retry time (rate-limited: faillog.go)
// and records an event.
func (l *loop) failed(o oe.Outcome) {
	a := o.Action
	now := l.clock.Now()
	wait := l.backoff.Failed(a.Key(), a.Kind, o.Err, now)
	var pods []cache.PodVolume
	switch a.Kind {
	case oe.OpPublish, oe.OpUnpublish:
		pods = []cache.PodVolume{a.Pod}
	default:
		_, pods, _ = l.dsw.Volume(a.Volume)
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
	if l.events == nil {
		return
	}
	reason := failureReason(a.Kind, o.Spec.Mode)
	if reason == "" {
		return
	}
	var ee *expandError
	if errors.As(o.Err, &ee) {
		reason = "FileSystemResizeFailed" // published, not grown
	}
	if nodeLevel(a.Kind) {
		// No pod is left to tell: the Node is the object, as for the
		// kubelet's node-level volume problems.
		ref := &v1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: l.node, UID: types.UID(l.node)}
		l.events.Event(ref, v1.EventTypeWarning, reason, o.Err.Error())
		return
	}
	for _, p := range pods {
		if p.Pod.Name == "" {
			continue // a mount found on disk whose pod was not added again: no object to name
		}
		ref := &v1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: p.Pod.Namespace, Name: p.Pod.Name, UID: p.Pod.UID}
		l.events.Event(ref, v1.EventTypeWarning, reason, o.Err.Error())
	}
}

// resync plans every volume again, resolves again the pods that could not
// be, looks again for mount references and unreadable directories, and
// marks the volumes of requiresRepublish drivers for republishing.
func (l *loop) resync() {
	for _, n := range l.dsw.VolumeNames() {
		l.dirty[n] = struct{}{}
	}
	for _, n := range l.asw.VolumeNames() {
		l.dirty[n] = struct{}{}
	}
	l.refs = map[cache.UniqueVolumeName][]string{}
	for name, dir := range l.unreadable {
		_, err := os.Lstat(dir)
		if errors.Is(err, os.ErrNotExist) || err == nil && l.retake != nil && l.retake(dir) {
			delete(l.unreadable, name)
		}
	}
	var again map[types.UID]*v1.Pod
	for uid := range l.unresolved {
		again = addPod(again, uid, l.in)
	}
	if l.resolveAll && l.informersSynced {
		// Node-restricted mode: reading every pod's claims and volumes
		// keeps them in the fetcher's cache (and refreshed) while used.
		for uid := range l.known {
			again = addPod(again, uid, l.in)
		}
	}
	for uid, pod := range again {
		l.syncPod(uid, pod)
	}
	l.markRepublish()
}

// markRepublish asks for NodePublishVolume again for every Mounted pod
// volume of a driver whose CSIDriver sets requiresRepublish, as the kubelet
// does at each pod sync: such drivers refresh what they put into the volume
// (secrets, service account tokens).
func (l *loop) markRepublish() {
	if l.csiDrivers == nil {
		return
	}
	drivers, err := l.csiDrivers.List(labels.Everything())
	if err != nil {
		return
	}
	for _, d := range drivers {
		if d.Spec.RequiresRepublish == nil || !*d.Spec.RequiresRepublish {
			continue
		}
		for _, name := range l.dsw.VolumesOfDriver(d.Name) {
			_, desired, _ := l.dsw.Volume(name)
			actual, _ := l.asw.Volume(name)
			for _, p := range desired {
				if pm, ok := actual.Pods[p.Pod.UID]; ok && pm.State == cache.Mounted {
					l.republish[oe.Key{Volume: name, Pod: p.Pod.UID}] = true
				}
			}
		}
	}
}

// due marks the volumes whose backoff has ended dirty and returns when the
// next one ends (zero: none waits).
func (l *loop) due() time.Time {
	now := l.clock.Now()
	var next time.Time
	for name, at := range l.retryAt {
		if !now.Before(at) {
			delete(l.retryAt, name)
			l.dirty[name] = struct{}{}
			continue
		}
		if next.IsZero() || at.Before(next) {
			next = at
		}
	}
	return next
}

// idle reports whether the loop has nothing to do until something happens:
// nothing in the inbox, nothing to plan, nothing running. For tests.
func (l *loop) idle() bool {
	l.in.mu.Lock()
	empty := len(l.in.dirtyPods) == 0 && len(l.in.attachments) == 0 && len(l.in.claims) == 0 && len(l.in.volumes) == 0 && len(l.in.drivers) == 0 &&
		l.in.podsSynced == l.podsSynced && l.in.informersSynced == l.informersSynced
	l.in.mu.Unlock()
	return empty && len(l.dirty) == 0 && len(l.inflight) == 0
}

func cutKey(key string) (ns, name string, ok bool) {
	for i := 0; i < len(key); i++ {
		if key[i] == '/' {
			return key[:i], key[i+1:], true
		}
	}
	return "", key, false
}
