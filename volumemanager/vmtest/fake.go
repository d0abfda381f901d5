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
// call (Calls) and answers what the test has set with its Set methods. The
// zero answers are: waits succeed at once, no pod has volumes, no volume
// is attached, and the states have been synced (as with the kubelet's
// FakeVolumeManager). It is safe for concurrent use.
type Fake struct {
	mu           sync.Mutex
	calls        []Call
	mountErr     error
	unmountErr   error
	mounted      map[types.UID][]podvol.MountedVolume
	possibly     map[types.UID][]podvol.MountedVolume
	groups       map[types.UID][]int64
	inUse        []podvol.UniqueVolumeName
	attached     map[podvol.UniqueVolumeName]bool
	reported     []podvol.UniqueVolumeName
	notSynced    bool
	podsSynced   bool
	reportedOnce bool
}

var _ volumemanager.Interface = (*Fake)(nil)

// NewFake returns a Fake whose GetVolumesInUse returns volumesInUse, as
// the kubelet's NewFakeVolumeManager(initialVolumes) does.
func NewFake(volumesInUse ...podvol.UniqueVolumeName) *Fake {
	return &Fake{
		inUse:    slices.Clone(volumesInUse),
		mounted:  map[types.UID][]podvol.MountedVolume{},
		possibly: map[types.UID][]podvol.MountedVolume{},
		groups:   map[types.UID][]int64{},
		attached: map[podvol.UniqueVolumeName]bool{},
	}
}

func (f *Fake) record(c Call) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, c)
}

// Calls returns the calls made so far, in order.
func (f *Fake) Calls() []Call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// SetWaitForAttachAndMountError makes WaitForAttachAndMount return err
// (nil: succeed).
func (f *Fake) SetWaitForAttachAndMountError(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mountErr = err
}

// SetWaitForUnmountError makes WaitForUnmount and WaitForAllPodsUnmount
// return err (nil: succeed).
func (f *Fake) SetWaitForUnmountError(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unmountErr = err
}

// SetMountedVolumes sets the pod's mounted volumes, returned by
// GetMountedVolumesForPod and, unless SetPossiblyMountedVolumes says
// otherwise, GetPossiblyMountedVolumesForPod. No volumes forgets the pod.
func (f *Fake) SetMountedVolumes(uid types.UID, vols ...podvol.MountedVolume) {
	f.mu.Lock()
	defer f.mu.Unlock()
	setOrDelete(f.mounted, uid, vols)
}

// SetPossiblyMountedVolumes sets what GetPossiblyMountedVolumesForPod
// returns for the pod (mounted and Uncertain volumes).
func (f *Fake) SetPossiblyMountedVolumes(uid types.UID, vols ...podvol.MountedVolume) {
	f.mu.Lock()
	defer f.mu.Unlock()
	setOrDelete(f.possibly, uid, vols)
}

// SetExtraSupplementalGroups sets what GetExtraSupplementalGroupsForPod
// returns for the pod.
func (f *Fake) SetExtraSupplementalGroups(uid types.UID, gids ...int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	setOrDelete(f.groups, uid, gids)
}

// SetVolumesInUse sets what GetVolumesInUse returns.
func (f *Fake) SetVolumesInUse(names ...podvol.UniqueVolumeName) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inUse = slices.Clone(names)
}

// SetAttached sets what VolumeIsAttached returns for the volume.
func (f *Fake) SetAttached(name podvol.UniqueVolumeName, attached bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.attached[name] = attached
}

// SetStatesSynced sets what ReconcilerStatesHasBeenSynced returns
// (default true).
func (f *Fake) SetStatesSynced(synced bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.notSynced = !synced
}

// VolumesReportedInUse returns the volumes of the last
// MarkVolumesAsReportedInUse call, sorted, and whether there was one.
func (f *Fake) VolumesReportedInUse() ([]podvol.UniqueVolumeName, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reported), f.reportedOnce
}

// PodsSynced reports whether MarkPodsSynced has been called.
func (f *Fake) PodsSynced() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.podsSynced
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
	f.mu.Lock()
	defer f.mu.Unlock()
	f.podsSynced = true
}

// WaitForAttachAndMount records the call and returns the error set by
// SetWaitForAttachAndMountError, or ctx's error if ctx is already done.
func (f *Fake) WaitForAttachAndMount(ctx context.Context, pod *v1.Pod) error {
	f.record(Call{Method: "WaitForAttachAndMount", Pods: []types.UID{pod.UID}})
	return f.waitErr(ctx, f.mountErr)
}

// WaitForUnmount records the call and returns the error set by
// SetWaitForUnmountError, or ctx's error if ctx is already done.
func (f *Fake) WaitForUnmount(ctx context.Context, pod *v1.Pod) error {
	f.record(Call{Method: "WaitForUnmount", Pods: []types.UID{pod.UID}})
	return f.waitErr(ctx, f.unmountErr)
}

// WaitForAllPodsUnmount is WaitForUnmount for several pods, recorded as
// one call.
func (f *Fake) WaitForAllPodsUnmount(ctx context.Context, pods []*v1.Pod) error {
	c := Call{Method: "WaitForAllPodsUnmount"}
	for _, p := range pods {
		c.Pods = append(c.Pods, p.UID)
	}
	f.record(c)
	return f.waitErr(ctx, f.unmountErr)
}

func (f *Fake) waitErr(ctx context.Context, set error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return set
}

// GetMountedVolumesForPod records the call and returns what
// SetMountedVolumes set.
func (f *Fake) GetMountedVolumesForPod(uid types.UID) []podvol.MountedVolume {
	f.record(Call{Method: "GetMountedVolumesForPod", Pods: []types.UID{uid}})
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.mounted[uid])
}

// GetPossiblyMountedVolumesForPod records the call and returns what
// SetPossiblyMountedVolumes set, or else what SetMountedVolumes set.
func (f *Fake) GetPossiblyMountedVolumesForPod(uid types.UID) []podvol.MountedVolume {
	f.record(Call{Method: "GetPossiblyMountedVolumesForPod", Pods: []types.UID{uid}})
	f.mu.Lock()
	defer f.mu.Unlock()
	if vols, ok := f.possibly[uid]; ok {
		return slices.Clone(vols)
	}
	return slices.Clone(f.mounted[uid])
}

// GetExtraSupplementalGroupsForPod records the call and returns what
// SetExtraSupplementalGroups set.
func (f *Fake) GetExtraSupplementalGroupsForPod(pod *v1.Pod) []int64 {
	f.record(Call{Method: "GetExtraSupplementalGroupsForPod", Pods: []types.UID{pod.UID}})
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.groups[pod.UID])
}

// GetVolumesInUse records the call and returns, sorted, the volumes given
// to NewFake or SetVolumesInUse.
func (f *Fake) GetVolumesInUse() []podvol.UniqueVolumeName {
	f.record(Call{Method: "GetVolumesInUse"})
	f.mu.Lock()
	defer f.mu.Unlock()
	out := slices.Clone(f.inUse)
	slices.Sort(out)
	return out
}

// ReconcilerStatesHasBeenSynced records the call and returns true unless
// SetStatesSynced(false).
func (f *Fake) ReconcilerStatesHasBeenSynced() bool {
	f.record(Call{Method: "ReconcilerStatesHasBeenSynced"})
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.notSynced
}

// VolumeIsAttached records the call and returns what SetAttached set
// (default false).
func (f *Fake) VolumeIsAttached(name podvol.UniqueVolumeName) bool {
	f.record(Call{Method: "VolumeIsAttached", Volumes: []podvol.UniqueVolumeName{name}})
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.attached[name]
}

// MarkVolumesAsReportedInUse records the call; VolumesReportedInUse then
// returns names.
func (f *Fake) MarkVolumesAsReportedInUse(names []podvol.UniqueVolumeName) {
	f.record(Call{Method: "MarkVolumesAsReportedInUse", Volumes: slices.Clone(names)})
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reported = slices.Clone(names)
	slices.Sort(f.reported)
	f.reportedOnce = true
}

func setOrDelete[V any](m map[types.UID][]V, uid types.UID, vals []V) {
	if len(vals) == 0 {
		delete(m, uid)
		return
	}
	m[uid] = slices.Clone(vals)
}
