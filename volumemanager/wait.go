package volumemanager

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	vcache "github.com/nodevol/nodevol/cache"
	oe "github.com/nodevol/nodevol/operationexecutor"
)

// WaitForAttachAndMount blocks until every CSI volume of the pod is mounted,
// or ctx ends (bounded by Config.MountTimeout when ctx has no deadline).
// It adds the pod if it was not added. Its error (a *WaitError) names each
// volume that is not mounted and why.
func (vm *VolumeManager) WaitForAttachAndMount(ctx context.Context, pod *v1.Pod) error {
	if !vm.in.knows(pod.UID) {
		vm.AddPod(pod)
	}
	vols, _ := podCSIVolumes(pod)
	return vm.wait(ctx, pod, func() []string {
		mounted := map[string]bool{}
		for _, v := range vm.asw.PodVolumes(pod.UID) {
			mounted[v.SpecName] = v.State == vcache.Mounted
		}
		var missing []string
		for _, v := range vols {
			if !mounted[v.Name] {
				missing = append(missing, v.Name)
			}
		}
		return missing
	}, "unmounted volumes")
}

// WaitForUnmount blocks until no volume of the pod may still be mounted
// (Uncertain, or with an operation running, counts as mounted), or ctx ends.
func (vm *VolumeManager) WaitForUnmount(ctx context.Context, pod *v1.Pod) error {
	return vm.wait(ctx, pod, func() []string {
		var left []string
		for _, v := range vm.asw.PodVolumes(pod.UID) {
			left = append(left, v.SpecName)
		}
		return left
	}, "volumes still mounted")
}

// wait re-checks pending() after every change to the pod's mounts until it
// returns nothing or ctx ends.
func (vm *VolumeManager) wait(ctx context.Context, pod *v1.Pod, pending func() []string, what string) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, vm.cfg.MountTimeout)
		defer cancel()
	}
	for {
		changed := vm.asw.PodChanged(pod.UID) // before the check: no change is missed
		left := pending()
		if len(left) == 0 {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return vm.waitError(ctx, pod, left, what)
		}
	}
}

// WaitError is the error of a wait that ended before its volumes were
// ready. It unwraps to the context's error.
type WaitError struct {
	// Pod is "namespace/name".
	Pod string
	// What is "unmounted volumes" or "volumes still mounted".
	What string
	// Volumes are the volumes (spec names) waited for, sorted.
	Volumes []string
	// Causes are the last error of each volume, where one is known.
	Causes map[string]error
	// Running says which operation runs on each volume where one does
	// (e.g. "NodePublishVolume still running after 3s"): it explains the
	// volume before its last error, which came from an earlier attempt.
	Running map[string]string
	// Waiting, where nothing runs or failed, says what the volume waits for.
	Waiting map[string]string
	// Err is the context's error.
	Err error
}

func (e *WaitError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "pod %s: %s=%v", e.Pod, e.What, e.Volumes)
	explained := false
	for _, name := range e.Volumes {
		err, running := e.Causes[name], e.Running[name]
		switch {
		case running != "" && err != nil:
			fmt.Fprintf(&b, "; volume %q: %s (last error: %v)", name, running, err)
		case running != "":
			fmt.Fprintf(&b, "; volume %q: %s", name, running)
		case err != nil:
			fmt.Fprintf(&b, "; volume %q: %v", name, err)
		case e.Waiting[name] != "":
			fmt.Fprintf(&b, "; volume %q: %s", name, e.Waiting[name])
		default:
			continue
		}
		explained = true
	}
	if !explained {
		fmt.Fprintf(&b, ": %v with no error reported", e.Err)
	}
	return b.String()
}

func (e *WaitError) Unwrap() error { return e.Err }

func (vm *VolumeManager) waitError(ctx context.Context, pod *v1.Pod, left []string, what string) error {
	causes := vm.loop.errs.get(pod.UID)
	// The volume of each spec name: the desired one, or for a pod that
	// is gone, the one it may still have mounted.
	volumes := map[string]vcache.UniqueVolumeName{}
	for _, v := range vm.asw.PodVolumes(pod.UID) {
		volumes[v.SpecName] = v.Name
	}
	if st, ok := vm.dsw.Pod(pod.UID); ok {
		for k, v := range st.Errors {
			causes[k] = v
		}
		for k, v := range st.Volumes {
			volumes[k] = v
		}
	}
	running := map[string]string{}
	now := vm.cfg.Clock.Now()
	for _, name := range left {
		if op, ok := vm.loop.running.of(volumes[name], pod.UID); ok {
			running[name] = op.describe(now)
		}
	}
	waiting := map[string]string{}
	if !vm.informersSynced() {
		why := "waiting for the informers to list PVCs, PVs, CSIDrivers and VolumeAttachments"
		if errs := vm.listErrs.get(); len(errs) > 0 {
			kinds := make([]string, 0, len(errs))
			for k := range errs {
				kinds = append(kinds, k)
			}
			sort.Strings(kinds)
			why += fmt.Sprintf(" (listing %s failed: %v)", kinds[0], errs[kinds[0]])
		}
		for _, name := range left {
			waiting[name] = why
		}
	}
	if vm.inUse != nil {
		for _, name := range left {
			if waiting[name] != "" {
				continue
			}
			if spec, _, ok := vm.dsw.Volume(volumes[name]); ok {
				if why := vm.inUse.waiting(spec.Name, spec.Driver); why != "" {
					waiting[name] = why
				}
			}
		}
	}
	sort.Strings(left)
	return &WaitError{Pod: pod.Namespace + "/" + pod.Name, What: what, Volumes: left, Causes: causes, Running: running, Waiting: waiting, Err: context.Cause(ctx)}
}

// runningOps holds the operations in flight and when each started, by
// volume, for the wait errors. The loop writes it where it writes its
// in-flight map (begin, apply); waiters read it.
type runningOps struct {
	mu  sync.Mutex
	ops map[vcache.UniqueVolumeName]map[oe.Key]runningOp
}

// runningOp is one operation in flight.
type runningOp struct {
	// Name is the CSI call it makes ("NodePublishVolume"), or the
	// kubelet's operation name where it makes none.
	Name string
	// Since is when the loop started it (it may have waited for one of
	// Config.MaxConcurrentOperations' slots before calling the driver).
	Since time.Time
}

// describe says how long the operation has been running at now.
func (o runningOp) describe(now time.Time) string {
	return fmt.Sprintf("%s still running after %s", o.Name, now.Sub(o.Since).Round(time.Millisecond))
}

func (r *runningOps) start(a oe.Action, mode vcache.VolumeMode, now time.Time) {
	name := a.Kind.CSICall()
	if name == "" {
		name = a.Kind.NameFor(mode)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ops == nil {
		r.ops = map[vcache.UniqueVolumeName]map[oe.Key]runningOp{}
	}
	if r.ops[a.Volume] == nil {
		r.ops[a.Volume] = map[oe.Key]runningOp{}
	}
	r.ops[a.Volume][a.Key()] = runningOp{Name: name, Since: now}
}

func (r *runningOps) done(a oe.Action) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ops := r.ops[a.Volume]; ops != nil {
		delete(ops, a.Key())
		if len(ops) == 0 {
			delete(r.ops, a.Volume)
		}
	}
}

// of returns the operation that a pod's use of a volume waits for: one on
// the pod's mount of it, else one on the whole volume.
func (r *runningOps) of(name vcache.UniqueVolumeName, uid types.UID) (runningOp, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ops := r.ops[name]
	if op, ok := ops[oe.Key{Volume: name, Pod: uid}]; ok {
		return op, true
	}
	op, ok := ops[oe.Key{Volume: name}]
	return op, ok
}
