package volumemanager

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/internal/podwait"
	"github.com/nodevol/nodevol/podvol"
)

// errStopped is the cause of a WaitForUnstaged that returned because Run has
// returned: nothing more will be torn down.
var errStopped = errors.New("volume manager stopped: nothing more will be torn down until it runs again")

// WaitForUnstaged blocks until every volume is torn down to the end: no
// pod added (and not deleted) has a volume, nothing is published, staged
// (NodeUnstageVolume has returned), attached by the node itself
// (Config.SelfAttach: its VolumeAttachment is deleted) or Uncertain, and
// no operation runs; or until ctx ends, bounded by ctx alone. It is what
// an agent about to exit after its pods went (a drained node, a node
// shutting down), or a test that checks the node is clean, waits for:
// WaitForUnmount returns once a pod's volumes are unpublished, before
// NodeUnstageVolume, as the kubelet's does.
//
// Its error is an *UnstageWaitError naming each volume still there and why
// (what is left of it, the operation running, what its teardown waits for,
// the last error of its unstage or detach), and the pods that still have
// volumes. It returns at once when Run has returned (nothing more will be
// torn down) and, with a ctx already done, reports the state as it is.
//
// It is not part of Interface, which is the kubelet's: the kubelet's
// volume manager has no such wait.
func (vm *VolumeManager) WaitForUnstaged(ctx context.Context) error {
	for {
		// Before the check: no change is missed.
		changed := vm.unstaged.next()
		left := vm.notUnstaged()
		if left.empty() {
			vm.unstaged.done(changed)
			return nil
		}
		if vm.unstaged.isStopped() {
			vm.unstaged.done(changed)
			left.Err = errStopped
			return left
		}
		select {
		case <-changed:
		case <-ctx.Done():
			vm.unstaged.done(changed)
			left.Err = context.Cause(ctx)
			return left
		}
	}
}

// UnstageWaitError is the error of a WaitForUnstaged that ended before the node
// held no volume. It unwraps to the context's error (or says that Run has
// returned).
type UnstageWaitError struct {
	// Volumes are the volumes still on the node, wanted by a pod, or with
	// an operation running, sorted.
	Volumes []podvol.UniqueVolumeName
	// Left says what is left of each volume: "staged", "published for
	// pod ns/name", "wanted by pod ns/name", ...
	Left map[podvol.UniqueVolumeName][]string
	// Running says which operation runs on each volume where one does, in
	// its plugin's words (e.g. "NodeUnstageVolume still running after 3s"
	// for a CSI volume, "UnmountVolume.TearDown ..." for an emptyDir).
	Running map[podvol.UniqueVolumeName]string
	// Waiting says why a volume's due teardown does not start, as the
	// reconcile loop last planned it (a staging path still referenced, a
	// backoff, a hold on what was found on disk).
	Waiting map[podvol.UniqueVolumeName][]string
	// Causes are the last error of an operation on the whole volume
	// (NodeStageVolume, NodeUnstageVolume, an attach or a detach), where
	// one failed since the last that succeeded.
	Causes map[podvol.UniqueVolumeName]error
	// Pods are the pods added and not deleted that have volumes,
	// "namespace/name", sorted.
	Pods []string
	// Err is the context's cause when ctx ended first, or says that Run
	// has returned.
	Err error
}

func (e *UnstageWaitError) empty() bool { return len(e.Volumes) == 0 && len(e.Pods) == 0 }

func (e *UnstageWaitError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "volumes not torn down=%v", e.Volumes)
	for _, name := range e.Volumes {
		facts := slices.Clone(e.Left[name])
		if op := e.Running[name]; op != "" {
			facts = append(facts, op)
		}
		if err := e.Causes[name]; err != nil {
			facts = append(facts, fmt.Sprintf("last error: %v", err))
		}
		facts = append(facts, e.Waiting[name]...)
		if len(facts) > 0 {
			fmt.Fprintf(&b, "; volume %q: %s", name, strings.Join(facts, ", "))
		}
	}
	if len(e.Pods) > 0 {
		fmt.Fprintf(&b, "; pods with volumes=%v", e.Pods)
	}
	fmt.Fprintf(&b, ": %v", e.Err)
	return b.String()
}

// Unwrap returns Err.
func (e *UnstageWaitError) Unwrap() error { return e.Err }

// notUnstaged gathers what the node still holds or wants of its volumes,
// as an error without its cause.
func (vm *VolumeManager) notUnstaged() *UnstageWaitError {
	e := &UnstageWaitError{Left: map[podvol.UniqueVolumeName][]string{}, Running: map[podvol.UniqueVolumeName]string{},
		Waiting: map[podvol.UniqueVolumeName][]string{}, Causes: map[podvol.UniqueVolumeName]error{}}
	now := vm.cfg.Clock.Now()
	running := vm.loop.Running()
	names := map[podvol.UniqueVolumeName]bool{}
	for _, n := range vm.asw.VolumeNames() {
		names[n] = true
	}
	for _, n := range vm.dsw.VolumeNames() {
		names[n] = true
	}
	for n := range running {
		names[n] = true
	}
	for name := range names {
		left := vm.volumeLeft(name)
		op, busy := running[name]
		if len(left) == 0 && !busy {
			continue // torn down; the loop forgets it next
		}
		e.Volumes = append(e.Volumes, name)
		if len(left) > 0 {
			e.Left[name] = left
		}
		if busy {
			e.Running[name] = op.Describe(now)
		}
		waiting, err := vm.loop.VolumeNotes(name)
		if len(waiting) > 0 {
			e.Waiting[name] = waiting
		}
		if err != nil {
			e.Causes[name] = err
		}
	}
	slices.Sort(e.Volumes)
	e.Pods = vm.in.PodsWithVolumes(vm.volumes)
	return e
}

// volumeLeft says what is left of a volume on the node, or wanted of it:
// empty when nothing is.
func (vm *VolumeManager) volumeLeft(name podvol.UniqueVolumeName) []string {
	var left []string
	if v, ok := vm.asw.Volume(name); ok {
		switch v.DeviceState {
		case podvol.Mounted:
			left = append(left, "staged")
		case podvol.Uncertain:
			left = append(left, "possibly staged (uncertain: a NodeStageVolume or NodeUnstageVolume may have half-happened)")
		}
		for _, uid := range slices.Sorted(maps.Keys(v.Pods)) {
			pm := v.Pods[uid]
			switch {
			case pm.State == podvol.Mounted:
				left = append(left, "published for pod "+pm.Volume.Pod.String())
			case pm.MayBeMounted():
				left = append(left, "possibly published for pod "+pm.Volume.Pod.String())
			}
		}
		if v.SelfAttached {
			left = append(left, "attached by this node (its VolumeAttachment not deleted yet)")
		}
	}
	if _, pods, ok := vm.dsw.Volume(name); ok {
		for _, p := range pods {
			left = append(left, "wanted by pod "+p.Pod.String())
		}
	}
	return left
}

// unstageWaiters wakes the callers of WaitForUnstaged after each step of the
// reconcile loop (every change of the actual or desired state, every
// operation started or ended happens in one), and once Run has returned.
type unstageWaiters struct {
	mu      sync.Mutex
	waiters podwait.Set // under one key: the whole node
	stopped bool
}

// nodeKey is the one key of unstageWaiters.waiters.
const nodeKey types.UID = ""

// next returns a channel closed at the next wake; give it back with done.
func (w *unstageWaiters) next() <-chan struct{} { return w.waiters.ChangedUnder(&w.mu, nodeKey) }

// done gives back a channel from next.
func (w *unstageWaiters) done(ch <-chan struct{}) { w.waiters.DoneUnder(&w.mu, nodeKey, ch) }

// wake wakes every waiter.
func (w *unstageWaiters) wake() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.waiters.Wake(nodeKey)
}

// stop says that Run has returned, and wakes every waiter.
func (w *unstageWaiters) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	w.waiters.Wake(nodeKey)
}

func (w *unstageWaiters) isStopped() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stopped
}
