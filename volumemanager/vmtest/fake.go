package vmtest

import (
	"context"
	"slices"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volumemanager"
)

// Call is one recorded call to a Fake.
type Call struct {
	// Method is the method's name, e.g. "WaitForAttachAndMount".
	Method string
	// Pods are the UIDs of the pods the call named, in order.
	Pods []types.UID
	// Volumes are the volumes the call named (VolumeIsAttached,
	// MarkVolumesAsReportedInUse).
	Volumes []podvol.UniqueVolumeName
}

// Fake is a volumemanager.Interface that mounts nothing: it records every
// call (Calls) and answers what the test has set in its FakeAnswers (Set).
// The zero answers are: waits succeed at once, no pod has volumes, no
// volume is attached, and the states have been synced (as with the
// kubelet's FakeVolumeManager). It is safe for concurrent use.
type Fake struct {
	mu    sync.Mutex
	calls []Call
	ans   FakeAnswers
}

// FakeAnswers is what a Fake answers; a test changes it with Fake.Set.
// One struct rather than a setter per answer: a test sets what it needs
// in one call, under one lock.
type FakeAnswers struct {
	// WaitForAttachAndMountError is what WaitForAttachAndMount returns
	// (nil: succeed).
	WaitForAttachAndMountError error
	// WaitForUnmountError is what WaitForUnmount and
	// WaitForAllPodsUnmount return (nil: succeed).
	WaitForUnmountError error
	// Mounted are the pods' mounted volumes, by pod UID: what
	// GetMountedVolumesForPod returns and, for a pod PossiblyMounted does
	// not name, GetPossiblyMountedVolumesForPod.
	Mounted map[types.UID][]podvol.MountedVolume
	// PossiblyMounted is what GetPossiblyMountedVolumesForPod returns for
	// the pods it names (mounted and Uncertain volumes).
	PossiblyMounted map[types.UID][]podvol.MountedVolume
	// ExtraSupplementalGroups is what GetExtraSupplementalGroupsForPod
	// returns, by pod UID.
	ExtraSupplementalGroups map[types.UID][]int64
	// VolumesInUse is what GetVolumesInUse returns (sorted).
	VolumesInUse []podvol.UniqueVolumeName
	// Attached is what VolumeIsAttached returns (default false).
	Attached map[podvol.UniqueVolumeName]bool
	// StatesNotSynced makes ReconcilerStatesHasBeenSynced return false.
	StatesNotSynced bool
}

var _ volumemanager.Interface = (*Fake)(nil)

// NewFake returns a Fake whose GetVolumesInUse returns volumesInUse, as
// the kubelet's NewFakeVolumeManager(initialVolumes) does. Its answers'
// maps are made, for Set to fill.
func NewFake(volumesInUse ...podvol.UniqueVolumeName) *Fake {
	return &Fake{ans: FakeAnswers{
		VolumesInUse:            slices.Clone(volumesInUse),
		Mounted:                 map[types.UID][]podvol.MountedVolume{},
		PossiblyMounted:         map[types.UID][]podvol.MountedVolume{},
		ExtraSupplementalGroups: map[types.UID][]int64{},
		Attached:                map[podvol.UniqueVolumeName]bool{},
	}}
}

// Set calls fn with the Fake's answers, under its lock, for fn to change.
func (f *Fake) Set(fn func(*FakeAnswers)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(&f.ans)
}

func (f *Fake) record(c Call) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, c)
}

// Calls returns the calls made so far, in order (MarkPodsSynced and
// MarkVolumesAsReportedInUse among them: what they were told).
func (f *Fake) Calls() []Call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// Run records the call and blocks until ctx is done; it returns nil.
func (f *Fake) Run(ctx context.Context) error {
	f.record(Call{Method: "Run"})
	<-ctx.Done()
	return nil
}

// MarkPodsSynced records the call.
func (f *Fake) MarkPodsSynced() {
	f.record(Call{Method: "MarkPodsSynced"})
}

// WaitForAttachAndMount records the call and returns
// FakeAnswers.WaitForAttachAndMountError, or ctx's error if ctx is already
// done.
func (f *Fake) WaitForAttachAndMount(ctx context.Context, pod *v1.Pod) error {
	f.record(Call{Method: "WaitForAttachAndMount", Pods: []types.UID{pod.UID}})
	return f.waitErr(ctx, func(a *FakeAnswers) error { return a.WaitForAttachAndMountError })
}

// WaitForUnmount records the call and returns
// FakeAnswers.WaitForUnmountError, or ctx's error if ctx is already done.
func (f *Fake) WaitForUnmount(ctx context.Context, pod *v1.Pod) error {
	f.record(Call{Method: "WaitForUnmount", Pods: []types.UID{pod.UID}})
	return f.waitErr(ctx, func(a *FakeAnswers) error { return a.WaitForUnmountError })
}

// WaitForAllPodsUnmount is WaitForUnmount for several pods, recorded as
// one call.
func (f *Fake) WaitForAllPodsUnmount(ctx context.Context, pods []*v1.Pod) error {
	c := Call{Method: "WaitForAllPodsUnmount"}
	for _, p := range pods {
		c.Pods = append(c.Pods, p.UID)
	}
	f.record(c)
	return f.waitErr(ctx, func(a *FakeAnswers) error { return a.WaitForUnmountError })
}

func (f *Fake) waitErr(ctx context.Context, set func(*FakeAnswers) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return set(&f.ans)
}

// GetMountedVolumesForPod records the call and returns
// FakeAnswers.Mounted[uid].
func (f *Fake) GetMountedVolumesForPod(uid types.UID) []podvol.MountedVolume {
	f.record(Call{Method: "GetMountedVolumesForPod", Pods: []types.UID{uid}})
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.ans.Mounted[uid])
}

// GetPossiblyMountedVolumesForPod records the call and returns
// FakeAnswers.PossiblyMounted[uid] if set, or else Mounted[uid].
func (f *Fake) GetPossiblyMountedVolumesForPod(uid types.UID) []podvol.MountedVolume {
	f.record(Call{Method: "GetPossiblyMountedVolumesForPod", Pods: []types.UID{uid}})
	f.mu.Lock()
	defer f.mu.Unlock()
	if vols, ok := f.ans.PossiblyMounted[uid]; ok {
		return slices.Clone(vols)
	}
	return slices.Clone(f.ans.Mounted[uid])
}

// GetExtraSupplementalGroupsForPod records the call and returns
// FakeAnswers.ExtraSupplementalGroups[pod.UID].
func (f *Fake) GetExtraSupplementalGroupsForPod(pod *v1.Pod) []int64 {
	f.record(Call{Method: "GetExtraSupplementalGroupsForPod", Pods: []types.UID{pod.UID}})
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.ans.ExtraSupplementalGroups[pod.UID])
}

// GetVolumesInUse records the call and returns, sorted,
// FakeAnswers.VolumesInUse (at first the volumes given to NewFake).
func (f *Fake) GetVolumesInUse() []podvol.UniqueVolumeName {
	f.record(Call{Method: "GetVolumesInUse"})
	f.mu.Lock()
	defer f.mu.Unlock()
	out := slices.Clone(f.ans.VolumesInUse)
	slices.Sort(out)
	return out
}

// ReconcilerStatesHasBeenSynced records the call and returns true unless
// FakeAnswers.StatesNotSynced.
func (f *Fake) ReconcilerStatesHasBeenSynced() bool {
	f.record(Call{Method: "ReconcilerStatesHasBeenSynced"})
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.ans.StatesNotSynced
}

// VolumeIsAttached records the call and returns
// FakeAnswers.Attached[name] (default false).
func (f *Fake) VolumeIsAttached(name podvol.UniqueVolumeName) bool {
	f.record(Call{Method: "VolumeIsAttached", Volumes: []podvol.UniqueVolumeName{name}})
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ans.Attached[name]
}

// MarkVolumesAsReportedInUse records the call, with names (Calls).
func (f *Fake) MarkVolumesAsReportedInUse(names []podvol.UniqueVolumeName) {
	f.record(Call{Method: "MarkVolumesAsReportedInUse", Volumes: slices.Clone(names)})
}
