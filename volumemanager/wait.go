package volumemanager

import (
	"context"
	"fmt"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"

	vcache "github.com/nodevol/nodevol/cache"
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
	// Waiting, where nothing failed, says what the volume waits for.
	Waiting map[string]string
	// Err is the context's error.
	Err error
}

func (e *WaitError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "pod %s: %s=%v", e.Pod, e.What, e.Volumes)
	explained := false
	for _, name := range e.Volumes {
		if err := e.Causes[name]; err != nil {
			fmt.Fprintf(&b, "; volume %q: %v", name, err)
			explained = true
		} else if w := e.Waiting[name]; w != "" {
			fmt.Fprintf(&b, "; volume %q: %s", name, w)
			explained = true
		}
	}
	if !explained {
		fmt.Fprintf(&b, ": %v with no error reported", e.Err)
	}
	return b.String()
}

func (e *WaitError) Unwrap() error { return e.Err }

func (vm *VolumeManager) waitError(ctx context.Context, pod *v1.Pod, left []string, what string) error {
	causes := vm.loop.errs.get(pod.UID)
	if st, ok := vm.dsw.Pod(pod.UID); ok {
		for k, v := range st.Errors {
			causes[k] = v
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
	sort.Strings(left)
	return &WaitError{Pod: pod.Namespace + "/" + pod.Name, What: what, Volumes: left, Causes: causes, Waiting: waiting, Err: context.Cause(ctx)}
}
