package volumemanager

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volumemanager/internal/planner"
	"github.com/nodevol/nodevol/volumemanager/internal/resolve"
)

// WaitForAttachAndMount blocks until every volume of the pod that a
// registered plugin handles is mounted (an image volume too, which nothing
// is done for on the node),
// or ctx ends (bounded by Config.MountTimeout when ctx has no deadline).
// It adds the pod if it was not added. Its error (a *WaitError) names each
// volume that is not mounted and why.
//
// It returns before ctx ends, with a *WaitError that matches ErrFinal
// (errors.Is), as soon as a volume not mounted has an error that will not
// go away by waiting: a claim missing or not bound for
// Config.ClaimPendingGracePeriod, a volume refused to the pod
// (ReadWriteOncePod, SELinux context), a volume source nodevol cannot
// mount; and at once for a pod bound to another node (AddPod's error). It
// keeps waiting on errors that may resolve: a driver not registered yet,
// an attachment not confirmed yet, an operation failing with backoff.
//
// When ctx's deadline passes while a volume is not attached because the
// node has reached its driver's attach limit (a VolumeAttachment that
// failed with ResourceExhausted, for a driver whose CSIDriver sets
// nodeAllocatableUpdatePeriodSeconds), the *WaitError matches ErrFinal and
// wraps a *VolumeAttachLimitExceededError: the kubelet rejects such a pod
// with reason VolumeAttachmentLimitExceeded. For other drivers that wait
// ends as any that ran out of time, naming the attach error.
func (vm *VolumeManager) WaitForAttachAndMount(ctx context.Context, pod *v1.Pod) error {
	vols := resolve.PodVolumes(pod, vm.volumes)
	if err := vm.checkNode(pod); err != nil {
		names := make([]string, 0, len(vols))
		for _, v := range vols {
			names = append(names, v.Name)
		}
		sort.Strings(names)
		return &WaitError{Pod: pod.Namespace + "/" + pod.Name, What: "unmounted volumes", Volumes: names, Final: true, Err: err}
	}
	if !vm.in.Knows(pod.UID) {
		_ = vm.AddPod(pod) // its only error, checkNode's, was returned above
	}
	return vm.wait(ctx, pod, func() []string {
		mounted := map[string]bool{}
		for _, v := range vm.podVolumes(pod.UID) {
			mounted[v.SpecName] = v.State == podvol.Mounted
		}
		var missing []string
		for _, v := range vols {
			if !mounted[v.Name] {
				missing = append(missing, v.Name)
			}
		}
		return missing
	}, "unmounted volumes", true)
}

// WaitForUnmount blocks until no volume of the pod may still be mounted
// (Uncertain, or with an operation running, counts as mounted), or ctx ends.
func (vm *VolumeManager) WaitForUnmount(ctx context.Context, pod *v1.Pod) error {
	return vm.wait(ctx, pod, func() []string {
		var left []string
		for _, v := range vm.podVolumes(pod.UID) {
			left = append(left, v.SpecName)
		}
		return left
	}, "volumes still mounted", false)
}

// wait re-checks pending() after every change to the pod's mounts or
// errors until it returns nothing or ctx ends; with judge, it also returns
// once an error of a pending volume is final (planner.Finality), woken by a timer
// for an error that becomes final with time.
func (vm *VolumeManager) wait(ctx context.Context, pod *v1.Pod, pending func() []string, what string, judge bool) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, vm.cfg.MountTimeout)
		defer cancel()
	}
	var timer clock.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		// Both before the check: no change is missed.
		changed, errsChanged := vm.asw.PodChanged(pod.UID), vm.loop.PodErrorsChanged(pod.UID)
		left := pending()
		if len(left) == 0 {
			vm.waitDone(pod.UID, changed, errsChanged)
			return nil
		}
		var timerC <-chan time.Time
		if judge {
			final, at := vm.finalErrors(pod.UID, left)
			if final {
				vm.waitDone(pod.UID, changed, errsChanged)
				return vm.waitError(ctx, pod, left, what, true)
			}
			if timer != nil {
				timer.Stop()
				timer = nil
			}
			if !at.IsZero() {
				timer = vm.cfg.Clock.NewTimer(at.Sub(vm.cfg.Clock.Now()))
				timerC = timer.C()
				// A fake clock stepped past at between the judgment and
				// the arming fires the timer only at its next step: judge
				// again instead of waiting for it.
				if !vm.cfg.Clock.Now().Before(at) {
					vm.waitDone(pod.UID, changed, errsChanged)
					continue
				}
			}
		}
		select {
		case <-changed:
		case <-errsChanged:
		case <-timerC:
		case <-ctx.Done():
			vm.waitDone(pod.UID, changed, errsChanged)
			if judge {
				if limit := vm.attachLimit(ctx, pod, left, what); limit != nil {
					return limit
				}
			}
			return vm.waitError(ctx, pod, left, what, false)
		}
		vm.waitDone(pod.UID, changed, errsChanged)
	}
}

// waitDone gives back the channels a wait took: kept, they would stay until
// the pod's next change, for a mounted pod as long as it runs.
func (vm *VolumeManager) waitDone(uid types.UID, changed, errsChanged <-chan struct{}) {
	vm.asw.PodWaitDone(uid, changed)
	vm.loop.PodErrorsWaitDone(uid, errsChanged)
}

// podErrors are the last error of each of the pod's volumes: its
// resolution error, else the last error of an operation or a refusal.
func (vm *VolumeManager) podErrors(uid types.UID) map[string]error {
	causes := vm.loop.PodErrors(uid)
	if st, ok := vm.dsw.Pod(uid); ok {
		for k, v := range st.Errors {
			causes[k] = v
		}
		sharedCauses(causes, st.Shared)
	}
	return causes
}

// finalErrors reports whether a volume of left has a final error now, and
// else the earliest time one becomes final (zero: none will by waiting).
func (vm *VolumeManager) finalErrors(uid types.UID, left []string) (bool, time.Time) {
	causes := vm.podErrors(uid)
	now := vm.cfg.Clock.Now()
	var next time.Time
	for _, name := range left {
		final, at := planner.Finality(causes[name], now, vm.cfg.ClaimPendingGracePeriod)
		if final {
			return true, time.Time{}
		}
		if !at.IsZero() && (next.IsZero() || at.Before(next)) {
			next = at
		}
	}
	return false, next
}

// attachLimit is, for a mount wait that ran out of time (not one whose
// context was cancelled), the final *WaitError of a pod whose first
// volume of left (sorted) that the node's attach limit keeps unattached
// (its last error a *volume.AttachLimitError, and not attached since)
// wraps a *VolumeAttachLimitExceededError: the kubelet's check at the end
// of its wait. Nil when no volume is so.
//
// Not final before the deadline, although an event says the attacher
// failed: the external-attacher retries, and an exhaustion that passes
// (the detach of a deleted pod's volume not done yet when its replacement
// is attached) must not get the pod refused, as the kubelet would not
// within its wait (Config.MountTimeout defaults to its length).
func (vm *VolumeManager) attachLimit(ctx context.Context, pod *v1.Pod, left []string, what string) error {
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return nil
	}
	st, ok := vm.dsw.Pod(pod.UID)
	if !ok {
		return nil
	}
	causes := vm.podErrors(pod.UID)
	sorted := slices.Sorted(slices.Values(left))
	for _, name := range sorted {
		var limit *volume.AttachLimitError
		if !errors.As(causes[name], &limit) {
			continue
		}
		if v, ok := vm.asw.Volume(st.Volumes[name]); ok && v.Attached {
			continue // attached since the error
		}
		e := vm.waitError(ctx, pod, left, what, true).(*WaitError)
		e.Err = &VolumeAttachLimitExceededError{Pod: e.Pod, Volume: name, Driver: limit.Driver,
			VolumeAttachment: limit.VolumeAttachment, Message: limit.Message, Err: limit}
		return e
	}
	return nil
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
	// Running says which operation runs on each volume where one does, in
	// its plugin's words ("NodePublishVolume still running after 3s" for a
	// CSI volume, the kubelet's "MountVolume.SetUp still running after 3s"
	// for an emptyDir): it explains the
	// volume before its last error, which came from an earlier attempt.
	Running map[string]string
	// Waiting, where nothing runs or failed, says what the volume waits for.
	Waiting map[string]string
	// Final is true when the wait returned before its deadline because
	// the pod's errors will not resolve by waiting (ErrFinal), or ran out
	// of time with a volume held by the node's attach limit; false when
	// ctx ended first otherwise.
	Final bool
	// Err is the context's error when ctx ended first; for a final wait,
	// nil, the pod's own error (a pod bound to another node), or a
	// *VolumeAttachLimitExceededError.
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
			// A resolution error names the pod and volume itself: said
			// once is enough.
			msg := strings.TrimPrefix(err.Error(), fmt.Sprintf("pod %s volume %q: ", e.Pod, name))
			fmt.Fprintf(&b, "; volume %q: %s", name, msg)
		case e.Waiting[name] != "":
			fmt.Fprintf(&b, "; volume %q: %s", name, e.Waiting[name])
		default:
			continue
		}
		explained = true
	}
	var limit *VolumeAttachLimitExceededError
	switch {
	case e.Final && errors.As(e.Err, &limit):
		// The volume's cause above says the rest.
		fmt.Fprintf(&b, ": %s (volume %q)", VolumeAttachmentLimitExceededReason, limit.Volume)
	case e.Final && e.Err != nil:
		fmt.Fprintf(&b, ": %v", e.Err)
	case !explained:
		fmt.Fprintf(&b, ": %v with no error reported", e.Err)
	}
	return b.String()
}

// Unwrap returns Err: the context's error for a wait that ran out of time.
func (e *WaitError) Unwrap() error { return e.Err }

// Is makes a final wait's error match ErrFinal.
func (e *WaitError) Is(target error) bool { return target == ErrFinal && e.Final }

func (vm *VolumeManager) waitError(ctx context.Context, pod *v1.Pod, left []string, what string, final bool) error {
	causes := vm.podErrors(pod.UID)
	// The volume of each spec name: the desired one, or for a pod that
	// is gone, the one it may still have mounted.
	volumes := map[string]podvol.UniqueVolumeName{}
	for _, v := range vm.podVolumes(pod.UID) {
		volumes[v.SpecName] = v.Name
	}
	if st, ok := vm.dsw.Pod(pod.UID); ok {
		for k, v := range st.Volumes {
			volumes[k] = v
		}
	}
	running := map[string]string{}
	now := vm.cfg.Clock.Now()
	for _, name := range left {
		if op, ok := vm.loop.RunningOf(volumes[name], pod.UID); ok {
			running[name] = op.Describe(now)
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
				if why := vm.inUse.waiting(&spec); why != "" {
					waiting[name] = why
				}
			}
		}
	}
	sort.Strings(left)
	e := &WaitError{Pod: pod.Namespace + "/" + pod.Name, What: what, Volumes: left, Causes: causes, Running: running, Waiting: waiting, Final: final}
	if !final {
		e.Err = context.Cause(ctx)
	}
	return e
}
