package reconciler

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

// Loop owns the actual state of the world. Everything that changes it
// arrives as an event: a batch from the inbox (pods, claims, drivers,
// retries), an operation's outcome, the backoff timer, the resync tick.
// After each event the loop resolves the pods that changed into the
// desired state (internal/resolve), builds a view of each volume that changed and
// asks the planner (internal/planner) what to do; it applies what the
// planner returns. Nothing else writes the actual state, and nothing else
// decides. Its methods run on one goroutine (the manager's run loop),
// except the readers for the waits (waits.go), which lock.
//
// The manager's Run drives it with goroutines; the scenario scripts drive
// it step by step (Process, Apply) with a fake clock and a recording Host.
type Loop struct {
	Config
	in *Inbox
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

// Config is the loop's wiring, given once to newLoop.
type Config struct {
	// Node is this node's name.
	Node string
	// Clock is the loop's time: backoffs, retries, the wanted-since stamps.
	Clock clock.Clock
	// DSW and ASW are the desired and the actual state; the loop is the
	// only writer of both.
	DSW *state.DesiredStateOfWorld
	ASW *state.ActualStateOfWorld
	// Metrics counts what the loop does (nil: nothing is counted).
	Metrics *Metrics
	// Events records the pods' events (nil: none).
	Events record.EventRecorder
	// Volumes finds each volume's plugin, whose Capabilities the planner
	// reads.
	Volumes *volume.Registry
	// OwnAttachments lists the VolumeAttachments, to find at start the
	// node's own whose volumes left nothing on disk (adoptAttachments):
	// the informer's lister, or a one-time list; nil: none are looked for.
	OwnAttachments AttachmentLister
	// SelfAttach: the node creates and deletes VolumeAttachments itself.
	SelfAttach bool
	// Expands: a registered plugin grows volumes on the node
	// (volume.Expander); only then are claims' node expansions looked for.
	Expands bool
	// Holders returns the pods holding an object in the node's object
	// cache; nil: no object is held (objects and volumes that change
	// reach no pod).
	Holders ObjectHolders
	// Ready is closed once the loop has taken in that the informers have
	// synced; nil: nobody waits for it.
	Ready chan struct{}
	// Host is the manager around the loop (required).
	Host Host
}

// Host is what the loop asks of the manager around it: the one way out
// of the loop. Every method is called on the loop's goroutine; one whose
// job the manager does not do (no in-use reporting, attachments read
// through informers) does nothing.
type Host interface {
	// Start starts an operation; its outcome comes back through Apply.
	Start(a oe.Action, in Input)
	// HoldPod makes the pod hold the API objects its volumes read in the
	// node's object cache, before it is resolved; pod nil: the pod is
	// gone, drop what the node keeps for it (its holds, its tokens).
	HoldPod(uid types.UID, pod *v1.Pod)
	// HoldAttachment makes a volume hold the VolumeAttachment it waits
	// for in the object cache ("": none).
	HoldAttachment(name podvol.UniqueVolumeName, va string)
	// AttachHeld reports whether an attachable volume's attachment must
	// wait to be reported in use.
	AttachHeld(name podvol.UniqueVolumeName) bool
	// Forgotten is told that a volume left the actual state.
	Forgotten()
	// Retake removes an unreadable pod volume directory that can no
	// longer hold data (what made it unreadable is gone), reporting
	// whether it did.
	Retake(dir string) bool
}

// ObjectHolders finds the holders of an object in the node's object
// cache (objectcache.Cache).
type ObjectHolders interface {
	Holders(objectcache.Ref) []string
}

// Input is what an operation needs.
type Input struct {
	oe.Input
	// VolumePath is where a pod has the volume published (expansion).
	VolumePath string
	// Expansion is an expansion's target (planner.Decision.Expansion).
	Expansion planner.Expansion
}

// New returns a loop on cfg that takes its events from in and resolves
// pods through pods.
func New(cfg Config, in *Inbox, pods *resolve.Table) *Loop {
	return &Loop{
		Config:     cfg,
		in:         in,
		pods:       pods,
		vols:       map[podvol.UniqueVolumeName]*volumeMemo{},
		queue:      newVolumeQueue(cfg.Clock),
		unreadable: map[string]string{},
		backoff:    oe.NewBackoff(oe.BackoffOptions{}),
		errs:       &podErrors{},
		running:    &runningOps{},
		notes:      &volumeNotes{},
		failLog:    newFailureLog(failureLogBurst, failureLogInterval),
		logger:     klog.Background(),
	}
}

// Install makes what reconstruction found the initial actual state.
func (l *Loop) Install(d volume.Found) {
	l.Metrics.reconstructed(d)
	for _, m := range d.Mounts {
		l.ASW.SetFoundPodMount(m.Spec, m.Volume, m.State, m.Path)
		l.vol(m.Spec.Name).foundMount(m.Volume.Pod.UID)
		l.queue.add(m.Spec.Name)
	}
	for _, dev := range d.Devices {
		l.ASW.SetDeviceState(dev.Spec, dev.State, dev.Path)
		l.ASW.SetDeviceSELinuxContext(dev.Spec, dev.SELinuxContext)
		l.vol(dev.Spec.Name).foundDevice = true
		l.queue.add(dev.Spec.Name)
	}
	for _, dir := range d.Unreadable {
		l.unreadable[filepath.Base(dir)] = dir
	}
	if l.SelfAttach {
		// An earlier run may have created their VolumeAttachments: each is
		// deleted once its volume is torn down (a missing one costs a GET).
		for _, n := range l.ASW.VolumeNames() {
			if v, ok := l.ASW.Volume(n); ok && !v.Spec.Ephemeral {
				l.ASW.SetSelfAttached(v.Spec, true)
			}
		}
	}
}

// Process takes the inbox, resolves the pods that changed and plans every
// volume that changed.
func (l *Loop) Process(ctx context.Context) {
	b := l.in.take()
	if b.informersSynced && !l.informersSynced {
		l.informersSynced = true
		l.adoptAttachments()
		if l.Ready != nil {
			close(l.Ready)
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
	l.PlanDirty(ctx)
}

// worldChanged takes in the changes of the world a batch brings for
// volumes that may be backing off: a driver registered (or its CSIDriver
// changed), a volume reported in use, a VolumeAttachment changed.
func (l *Loop) worldChanged(b batch) {
	for name := range b.drivers {
		for _, n := range l.DSW.VolumesOfDriver(name) {
			l.retry(n)
		}
		for _, n := range l.ASW.VolumeNames() {
			if v, ok := l.ASW.Volume(n); ok && v.Spec.Driver == name {
				l.retry(n)
			}
		}
	}
	for n := range b.volumes {
		l.retry(n)
	}
	if len(b.plugins) > 0 {
		for _, names := range [][]podvol.UniqueVolumeName{l.DSW.VolumeNames(), l.ASW.VolumeNames()} {
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

func addPod(pods map[types.UID]*v1.Pod, uid types.UID, in *Inbox) map[types.UID]*v1.Pod {
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
func (l *Loop) claimChanged(key string) {
	if !l.Expands {
		return
	}
	if pv := l.pods.ClaimVolume(key); pv != "" {
		if n, ok := l.DSW.VolumeForPV(pv); ok {
			l.queue.add(n)
		}
	}
}

// syncPod puts a pod into the desired state, or takes it out (pod nil).
func (l *Loop) syncPod(uid types.UID, pod *v1.Pod) {
	switch {
	case pod == nil:
		l.Host.HoldPod(uid, nil)
		l.pods.Forget(uid)
		l.errs.forget(uid)
		l.DSW.DeletePod(uid) // notifies the volumes it touched
	case !l.informersSynced:
		l.pods.WaitForListers(uid, resolve.PodRef(pod))
	default:
		l.Host.HoldPod(uid, pod)
		ref, wanted, resolved, errs := l.pods.Resolve(pod, l.logger)
		if events := l.pods.ResolutionEvents(uid, errs); l.Events != nil {
			for _, msg := range events {
				l.Events.Event(PodObjectRef(ref), v1.EventTypeWarning, reasonFailedMount, msg)
			}
		}
		now := l.Clock.Now()
		for i := range resolved {
			resolved[i].Now = now // the pod volumes new to the desired state are wanted since now
		}
		l.republishChanged(uid, resolved)
		l.countSELinuxAdmitted(resolved)
		l.DSW.SetPod(ref, wanted, resolved, errs)
		l.errs.wake(uid) // its waiters judge the new errors (final or not)
	}
	l.dirtyPodMounts(uid)
}

// dirtyPodMounts plans again every volume the pod may have mounted: its
// hold may have changed.
func (l *Loop) dirtyPodMounts(uid types.UID) {
	for _, v := range l.ASW.PodVolumes(uid) {
		l.queue.add(v.Name)
	}
}

// retry tells the planner that the world changed for a volume (its
// backoff may be forgotten) and plans it again.
func (l *Loop) retry(name podvol.UniqueVolumeName) {
	rec := l.vol(name)
	rec.worldChanged = true
	if rec.inflight != nil {
		rec.olderWorld = true
	}
	l.queue.add(name)
}

// MarkDirty is the desired state's notification: a volume's pods changed.
func (l *Loop) MarkDirty(name podvol.UniqueVolumeName) { l.queue.add(name) }

// PlanDirty plans every dirty volume and applies what the plans say.
func (l *Loop) PlanDirty(ctx context.Context) {
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
func (l *Loop) planVolume(_ context.Context, name podvol.UniqueVolumeName) {
	v := l.view(name)
	d := planner.Plan(v)
	rec := l.vol(name)
	if d.NodeSize > 0 {
		l.ASW.SetSize(name, d.NodeSize)
	}
	if d.ForgetExpandHold {
		rec.expandHeld = planner.ExpandHold{}
	}
	for _, p := range d.Adopt {
		l.ASW.SetPodMount(v.Spec, p, podvol.Mounted, "")
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
			l.ASW.DeleteVolume(name)
			l.Host.Forgotten()
		}
		l.forget(name)
		return
	}
	for _, a := range d.Actions {
		l.begin(a, v, d.Expansion)
	}
}

// forget drops everything the loop keeps of a volume.
func (l *Loop) forget(name podvol.UniqueVolumeName) {
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
func (l *Loop) view(name podvol.UniqueVolumeName) planner.View {
	spec, desired, wanted := l.DSW.Volume(name)
	actual, known := l.ASW.Volume(name)
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
		Refs: rec.refs, Resync: l.resyncs, Now: l.Clock.Now(), SelfAttach: l.SelfAttach,
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
		v.AttachHeld = l.Host.AttachHeld(name)
	}
	for _, p := range desired {
		if rec.republish[p.Pod.UID] {
			if v.Republish == nil {
				v.Republish = map[types.UID]bool{}
			}
			v.Republish[p.Pod.UID] = true
		}
	}
	if spec.PVName != "" && l.Expands && planner.ExpansionLooked(v) {
		v.Expansion = planner.ExpansionFacts{Expands: true, Held: rec.expandHeld}
		v.Expansion.PV, v.Expansion.PVC = l.pods.ExpansionClaim(&spec)
	}
	return v
}

// Resync plans every volume again, resolves again the pods that could not
// be, makes the planner look again for mount references (an unstage
// gathers them), looks again for unreadable directories, and marks the
// volumes of requiresRepublish drivers for republishing.
func (l *Loop) Resync() {
	for _, n := range l.DSW.VolumeNames() {
		l.queue.add(n)
	}
	for _, n := range l.ASW.VolumeNames() {
		l.queue.add(n)
	}
	l.resyncs++
	for name, dir := range l.unreadable {
		_, err := os.Lstat(dir)
		if errors.Is(err, os.ErrNotExist) || err == nil && l.Host.Retake(dir) {
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
func (l *Loop) markRepublish() {
	for _, name := range l.DSW.VolumeNames() {
		spec, desired, _ := l.DSW.Volume(name)
		if caps, err := l.capabilities(&spec); err != nil || !caps.Republish {
			continue
		}
		actual, _ := l.ASW.Volume(name)
		for _, p := range desired {
			if pm, ok := actual.Pods[p.Pod.UID]; ok && pm.State == podvol.Mounted {
				l.vol(name).markRepublish(p.Pod.UID)
			}
		}
	}
}

// capabilities asks the volume's plugin what it does with the volume: in
// memory only (the driver registry, the CSIDriver lister).
func (l *Loop) capabilities(spec *podvol.VolumeSpec) (volume.Capabilities, error) {
	p, err := l.Volumes.ForVolume(spec.Name)
	if err != nil {
		return volume.Capabilities{}, err
	}
	return p.Capabilities(spec)
}

// Due queues the volumes whose backoff has ended.
func (l *Loop) Due() { l.queue.due() }

// Idle reports whether the loop has nothing to do until something happens:
// nothing in the inbox, nothing to plan, nothing running (MarkPodsSynced
// not taken in only while pods wait for reads of the API server that
// failed: their retries come as objects changed; a read in flight is not
// idle). For tests.
func (l *Loop) Idle() bool {
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
