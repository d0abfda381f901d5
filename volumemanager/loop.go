package volumemanager

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
	"github.com/nodevol/nodevol/volumemanager/internal/planner"
	"github.com/nodevol/nodevol/volumemanager/internal/resolve"
	"github.com/nodevol/nodevol/volumemanager/internal/state"
)

// loop owns the actual state of the world. Everything that changes it
// arrives as an event: a batch from the inbox (pods, claims, drivers,
// retries), an operation's outcome, the backoff timer, the resync tick.
// After each event the loop resolves the pods that changed into the
// desired state (internal/resolve), builds a view of each volume that changed and
// asks the planner (internal/planner) what to do; it applies what the
// planner returns. Nothing else writes the actual state, and nothing else
// decides.
//
// Run drives it with goroutines; the scenario scripts drive it step by
// step (process, apply) with a fake clock and a recording start.
type loop struct {
	loopConfig
	in *inbox
	// pods are the pods added and how far each is resolved.
	pods *resolve.Table
	// vols is what the loop keeps of each volume (volumeMemo).
	vols map[podvol.UniqueVolumeName]*volumeMemo
	// queue holds the volumes to plan, now or once their backoff ends.
	queue volumeQueue
	// unreadable are pod volume directories whose vol_data.json could not
	// be read, by the name (a PV's) they are under.
	unreadable map[string]string
	backoff    *oe.Backoff
	errs       *podErrors
	// running mirrors the operations in flight, with start times, for the
	// wait errors.
	running *runningOps
	// notes keep why each volume waits and its last volume-level error,
	// for WaitForUnstaged's error.
	notes *volumeNotes
	// failLog rate-limits the failure lines (faillog.go).
	failLog *failureLog
	logger  klog.Logger
	// informersSynced and podsSynced say what the loop has taken in from
	// the inbox; resyncs counts the periodic resyncs.
	informersSynced, podsSynced bool
	resyncs                     int
}

// loopConfig is the loop's wiring, given once to newLoop.
type loopConfig struct {
	node    string
	clock   clock.Clock
	dsw     *state.DesiredStateOfWorld
	asw     *state.ActualStateOfWorld
	metrics *metrics
	events  record.EventRecorder
	// volumes finds each volume's plugin, whose Capabilities the planner
	// reads.
	volumes *volume.Registry
	// ownAttachments lists the VolumeAttachments, to find at start the
	// node's own whose volumes left nothing on disk (adoptAttachments):
	// the informer's lister, or a one-time list (attachmentsOnce); nil:
	// none are looked for.
	ownAttachments attachmentLister
	// selfAttach: the node creates and deletes VolumeAttachments itself
	// (Config.SelfAttach).
	selfAttach bool
	// expands: a registered plugin grows volumes on the node
	// (volume.Expander); only then are claims' node expansions looked for.
	expands bool
	// holders returns the pods holding an object in the node's object
	// cache; nil: no object is held (objects and volumes that change
	// reach no pod).
	holders objectHolders
	// ready is closed once the loop has taken in that the informers have
	// synced; nil: nobody waits for it.
	ready chan struct{}
	host  loopHost
}

// loopHost is what the loop asks of the manager around it: the one way
// out of the loop. Every method is called on the loop's goroutine; one
// whose job the manager does not do (no in-use reporting, attachments
// read through informers) does nothing.
type loopHost interface {
	// start starts an operation; its outcome comes back through apply.
	start(a oe.Action, in opInput)
	// holdPod makes the pod hold the API objects its volumes read in the
	// node's object cache, before it is resolved; pod nil: the pod is
	// gone, drop what the node keeps for it (its holds, its tokens).
	holdPod(uid types.UID, pod *v1.Pod)
	// holdAttachment makes a volume hold the VolumeAttachment it waits
	// for in the object cache ("": none).
	holdAttachment(name podvol.UniqueVolumeName, va string)
	// attachHeld reports whether an attachable volume's attachment must
	// wait to be reported in use.
	attachHeld(name podvol.UniqueVolumeName) bool
	// forgotten is told that a volume left the actual state.
	forgotten()
	// retake removes an unreadable pod volume directory that can no
	// longer hold data (what made it unreadable is gone), reporting
	// whether it did.
	retake(dir string) bool
}

// objectHolders finds the holders of an object in the node's object
// cache (objectcache.Cache).
type objectHolders interface {
	Holders(objectcache.Ref) []string
}

// opInput is what an operation needs.
type opInput struct {
	oe.Input
	// VolumePath is where a pod has the volume published (expansion).
	VolumePath string
	// Expansion is an expansion's target (planner.Decision.Expansion).
	Expansion planner.Expansion
}

func newLoop(cfg loopConfig, in *inbox, pods *resolve.Table) *loop {
	return &loop{
		loopConfig: cfg,
		in:         in,
		pods:       pods,
		vols:       map[podvol.UniqueVolumeName]*volumeMemo{},
		queue:      newVolumeQueue(cfg.clock),
		unreadable: map[string]string{},
		backoff:    oe.NewBackoff(oe.BackoffOptions{}),
		errs:       &podErrors{},
		running:    &runningOps{},
		notes:      &volumeNotes{},
		failLog:    newFailureLog(failureLogBurst, failureLogInterval),
		logger:     klog.Background(),
	}
}

// install makes what reconstruction found the initial actual state.
func (l *loop) install(d volume.Found) {
	l.metrics.reconstructed(d)
	for _, m := range d.Mounts {
		l.asw.SetFoundPodMount(m.Spec, m.Volume, m.State, m.Path)
		l.vol(m.Spec.Name).foundMount(m.Volume.Pod.UID)
		l.queue.add(m.Spec.Name)
	}
	for _, dev := range d.Devices {
		l.asw.SetDeviceState(dev.Spec, dev.State, dev.Path)
		l.asw.SetDeviceSELinuxContext(dev.Spec, dev.SELinuxContext)
		l.vol(dev.Spec.Name).foundDevice = true
		l.queue.add(dev.Spec.Name)
	}
	for _, dir := range d.Unreadable {
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
		if l.ready != nil {
			close(l.ready)
		}
		for _, uid := range l.pods.KnownUIDs() { // resolved now that the listers are complete
			if _, ok := b.pods[uid]; !ok {
				b.pods = addPod(b.pods, uid, l.in)
			}
		}
	}
	l.worldChanged(b)
	for _, uid := range l.podsOfVolumes(b.objects) {
		if _, ok := b.pods[uid]; !ok {
			b.pods = addPod(b.pods, uid, l.in)
		}
	}
	for key := range b.claims {
		for _, uid := range l.pods.WaitingFor(key) {
			if _, ok := b.pods[uid]; !ok {
				b.pods = addPod(b.pods, uid, l.in)
			}
		}
		l.claimChanged(key)
	}
	if b.node || len(b.plugins) > 0 {
		// Every known pod: a pod that could not be resolved may match
		// the Node now, and a resolved pod's downward API files may show
		// its allocatable resources (a limit a container does not set);
		// a pod volume of a plugin that came (a flexVolume driver) is
		// resolved now.
		for _, uid := range l.pods.KnownUIDs() {
			if _, ok := b.pods[uid]; !ok {
				b.pods = addPod(b.pods, uid, l.in)
			}
		}
	}
	for uid, pod := range b.pods {
		l.syncPod(uid, pod)
	}
	l.objectsChanged(b.objects)
	l.podCredentialsChanged(b.credentials)
	if b.podsSynced && l.informersSynced && !l.podsSynced && !l.pods.ReadsPending() {
		// Every pod added before MarkPodsSynced is in this batch or an
		// earlier one, and has been resolved above (or failed to be with
		// what the API server answered, and holds its own mounts): the
		// hold of what was found on disk lifts only now. A pod waiting for
		// a claim or volume the object cache has not read (its GET not
		// answered, or failing) may want any of those volumes, as a pod
		// may before the informers' first list: the hold lasts until its
		// reads answer (a batch then resolves it again) or it is deleted.
		l.podsSynced = true
		for name, rec := range l.vols {
			if rec.foundDevice || len(rec.foundMounts) > 0 {
				l.queue.add(name)
			}
			rec.foundDevice, rec.foundMounts = false, nil
		}
		l.logger.V(2).Info("Pods synced: volumes found on disk may be torn down once no resolved pod wants them")
	}
	l.planDirty(ctx)
}

// worldChanged takes in the changes of the world a batch brings for
// volumes that may be backing off: a driver registered (or its CSIDriver
// changed), a volume reported in use, a VolumeAttachment changed.
func (l *loop) worldChanged(b batch) {
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
	if len(b.plugins) > 0 {
		for _, names := range [][]podvol.UniqueVolumeName{l.dsw.VolumeNames(), l.asw.VolumeNames()} {
			for _, n := range names {
				if pluginOf(n, b.plugins) {
					l.retry(n)
				}
			}
		}
	}
	if len(b.attachments) == 0 {
		return
	}
	waiting := map[string]podvol.UniqueVolumeName{}
	for n, rec := range l.vols {
		if rec.attachment != "" {
			waiting[rec.attachment] = n
		}
	}
	for va := range b.attachments {
		if n, ok := waiting[va]; ok {
			l.retry(n)
		}
	}
}

func addPod(pods map[types.UID]*v1.Pod, uid types.UID, in *inbox) map[types.UID]*v1.Pod {
	if pods == nil {
		pods = map[types.UID]*v1.Pod{}
	}
	in.mu.Lock()
	pods[uid] = in.pods[uid].Pod()
	in.mu.Unlock()
	return pods
}

// claimChanged plans the volume of a changed claim again (its node
// expansion may be due).
func (l *loop) claimChanged(key string) {
	if !l.expands {
		return
	}
	if pv := l.pods.ClaimVolume(key); pv != "" {
		if n, ok := l.dsw.VolumeForPV(pv); ok {
			l.queue.add(n)
		}
	}
}

// syncPod puts a pod into the desired state, or takes it out (pod nil).
func (l *loop) syncPod(uid types.UID, pod *v1.Pod) {
	switch {
	case pod == nil:
		l.host.holdPod(uid, nil)
		l.pods.Forget(uid)
		l.errs.forget(uid)
		l.dsw.DeletePod(uid) // notifies the volumes it touched
	case !l.informersSynced:
		l.pods.WaitForListers(uid, resolve.PodRef(pod))
	default:
		l.host.holdPod(uid, pod)
		ref, wanted, resolved, errs := l.pods.Resolve(pod, l.logger)
		if events := l.pods.ResolutionEvents(uid, errs); l.events != nil {
			for _, msg := range events {
				l.events.Event(podObjectRef(ref), v1.EventTypeWarning, reasonFailedMount, msg)
			}
		}
		now := l.clock.Now()
		for i := range resolved {
			resolved[i].Now = now // the pod volumes new to the desired state are wanted since now
		}
		l.republishChanged(uid, resolved)
		l.countSELinuxAdmitted(resolved)
		l.dsw.SetPod(ref, wanted, resolved, errs)
		l.errs.wake(uid) // its waiters judge the new errors (final or not)
	}
	l.dirtyPodMounts(uid)
}

// dirtyPodMounts plans again every volume the pod may have mounted: its
// hold may have changed.
func (l *loop) dirtyPodMounts(uid types.UID) {
	for _, v := range l.asw.PodVolumes(uid) {
		l.queue.add(v.Name)
	}
}

// retry tells the planner that the world changed for a volume (its
// backoff may be forgotten) and plans it again.
func (l *loop) retry(name podvol.UniqueVolumeName) {
	rec := l.vol(name)
	rec.worldChanged = true
	if rec.inflight != nil {
		rec.olderWorld = true
	}
	l.queue.add(name)
}

// markDirty is the desired state's notification: a volume's pods changed.
func (l *loop) markDirty(name podvol.UniqueVolumeName) { l.queue.add(name) }

// planDirty plans every dirty volume and applies what the plans say.
func (l *loop) planDirty(ctx context.Context) {
	for l.queue.len() > 0 {
		for _, name := range l.queue.take() {
			l.planVolume(ctx, name)
		}
	}
}

// planVolume plans one volume and applies the decision: the node's size
// of the volume and the expansion hold, the adoptions and forgotten
// backoff first, then the refusals and waits, then the end of the volume
// or the operations to start.
func (l *loop) planVolume(_ context.Context, name podvol.UniqueVolumeName) {
	v := l.view(name)
	d := planner.Plan(v)
	rec := l.vol(name)
	if d.NodeSize > 0 {
		l.asw.SetSize(name, d.NodeSize)
	}
	if d.ForgetExpandHold {
		rec.expandHeld = planner.ExpandHold{}
	}
	for _, p := range d.Adopt {
		l.asw.SetPodMount(v.Spec, p, podvol.Mounted, "")
	}
	for _, k := range d.ForgetBackoff {
		l.backoff.Succeeded(k) // forgets k's failures
	}
	rec.worldChanged = false
	l.noteRefusals(name, &v.Spec, rec, d.Refused)
	l.queue.retryAt(name, d.Retry)
	rec.waiting = d.Waiting
	l.notes.setWaiting(name, d.Waiting)
	l.noteNotReady(name, rec, v.Desired, d.NotReady)
	if d.Done {
		if v.Known {
			l.asw.DeleteVolume(name)
			l.host.forgotten()
		}
		l.forget(name)
		return
	}
	for _, a := range d.Actions {
		l.begin(a, v, d.Expansion)
	}
}

// forget drops everything the loop keeps of a volume.
func (l *loop) forget(name podvol.UniqueVolumeName) {
	l.backoff.ForgetVolume(name)
	l.failLog.forgetVolume(name)
	l.notes.forget(name)
	l.queue.retryAt(name, time.Time{})
	if rec := l.vols[name]; rec != nil {
		l.setAttachment(name, rec, "")
		rec.forget()
		if rec.empty() {
			delete(l.vols, name)
		}
	}
}

// view gathers what the planner needs of one volume. It writes nothing:
// what the planner decides from it, the loop applies (planVolume).
func (l *loop) view(name podvol.UniqueVolumeName) planner.View {
	spec, desired, wanted := l.dsw.Volume(name)
	actual, known := l.asw.Volume(name)
	if !wanted {
		spec = actual.Spec
	}
	rec := l.vols[name]
	if rec == nil {
		rec = &volumeMemo{}
	}
	v := planner.View{
		Name: name, Spec: spec, Desired: desired, Actual: actual, Known: known,
		InFlight: rec.inflight, Backoff: l.backoff.Volume(name), WorldChanged: rec.worldChanged,
		Refs: rec.refs, Resync: l.resyncs, Now: l.clock.Now(), SelfAttach: l.selfAttach,
		PodsSynced: l.podsSynced, FoundDevice: rec.foundDevice,
	}
	if wanted {
		v.Caps, v.CapsErr = l.capabilities(&spec)
	}
	for uid := range actual.Pods {
		f := planner.PodFacts{Unresolved: l.pods.Hold(uid), Added: l.pods.IsKnown(uid), Found: rec.foundMounts[uid]}
		if f.Unresolved != "" || f.Found {
			if v.Pods == nil {
				v.Pods = map[types.UID]planner.PodFacts{}
			}
			v.Pods[uid] = f
		}
	}
	if spec.PVName != "" {
		v.Unreadable = l.unreadable[spec.PVName]
	}
	if wanted && !actual.Attached && v.Caps.Attachable {
		v.AttachHeld = l.host.attachHeld(name)
	}
	for _, p := range desired {
		if rec.republish[p.Pod.UID] {
			if v.Republish == nil {
				v.Republish = map[types.UID]bool{}
			}
			v.Republish[p.Pod.UID] = true
		}
	}
	if spec.PVName != "" && l.expands && planner.ExpansionLooked(v) {
		v.Expansion = planner.ExpansionFacts{Expands: true, Held: rec.expandHeld}
		v.Expansion.PV, v.Expansion.PVC = l.pods.ExpansionClaim(&spec)
	}
	return v
}

// resync plans every volume again, resolves again the pods that could not
// be, makes the planner look again for mount references (an unstage
// gathers them), looks again for unreadable directories, and marks the
// volumes of requiresRepublish drivers for republishing.
func (l *loop) resync() {
	for _, n := range l.dsw.VolumeNames() {
		l.queue.add(n)
	}
	for _, n := range l.asw.VolumeNames() {
		l.queue.add(n)
	}
	l.resyncs++
	for name, dir := range l.unreadable {
		_, err := os.Lstat(dir)
		if errors.Is(err, os.ErrNotExist) || err == nil && l.host.retake(dir) {
			delete(l.unreadable, name)
		}
	}
	var again map[types.UID]*v1.Pod
	for _, uid := range l.pods.Again() {
		again = addPod(again, uid, l.in)
	}
	for uid, pod := range again {
		l.syncPod(uid, pod)
	}
	l.markRepublish()
}

// markRepublish asks for NodePublishVolume again for every Mounted pod
// volume whose plugin republishes it (Capabilities.Republish: the CSIDriver
// sets requiresRepublish), as the kubelet does at each pod sync: such
// drivers refresh what they put into the volume (secrets, service account
// tokens). The planner publishes again only while the capability holds.
func (l *loop) markRepublish() {
	for _, name := range l.dsw.VolumeNames() {
		spec, desired, _ := l.dsw.Volume(name)
		if caps, err := l.capabilities(&spec); err != nil || !caps.Republish {
			continue
		}
		actual, _ := l.asw.Volume(name)
		for _, p := range desired {
			if pm, ok := actual.Pods[p.Pod.UID]; ok && pm.State == podvol.Mounted {
				l.vol(name).markRepublish(p.Pod.UID)
			}
		}
	}
}

// capabilities asks the volume's plugin what it does with the volume: in
// memory only (the driver registry, the CSIDriver lister).
func (l *loop) capabilities(spec *podvol.VolumeSpec) (volume.Capabilities, error) {
	return capabilitiesOf(l.volumes, spec)
}

// capabilitiesOf asks the plugin of spec, found in plugins, what it does
// with the volume.
func capabilitiesOf(plugins *volume.Registry, spec *podvol.VolumeSpec) (volume.Capabilities, error) {
	p, err := plugins.ForVolume(spec.Name)
	if err != nil {
		return volume.Capabilities{}, err
	}
	return p.Capabilities(spec)
}

// due queues the volumes whose backoff has ended.
func (l *loop) due() { l.queue.due() }

// idle reports whether the loop has nothing to do until something happens:
// nothing in the inbox, nothing to plan, nothing running (MarkPodsSynced
// not taken in only while pods wait for reads of the API server that
// failed: their retries come as objects changed; a read in flight is not
// idle). For tests.
func (l *loop) idle() bool {
	l.in.mu.Lock()
	empty := len(l.in.dirtyPods) == 0 && len(l.in.attachments) == 0 && len(l.in.claims) == 0 && len(l.in.volumes) == 0 && len(l.in.drivers) == 0 && len(l.in.plugins) == 0 &&
		(l.in.podsSynced == l.podsSynced || l.pods.ReadsPending() && !l.pods.ReadsInFlight()) && l.in.informersSynced == l.informersSynced
	l.in.mu.Unlock()
	if !empty || l.queue.len() > 0 {
		return false
	}
	for _, rec := range l.vols {
		if rec.inflight != nil {
			return false
		}
	}
	return true
}
