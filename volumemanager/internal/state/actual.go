package state

import (
	"maps"
	"slices"
	"sort"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/internal/podwait"

	"github.com/nodevol/nodevol/podvol"
)

// ActualVolume is a snapshot of what is really done for one volume on this node.
type ActualVolume struct {
	Spec podvol.VolumeSpec
	// Attached is true once the attachment was confirmed (or not needed).
	Attached bool
	// SelfAttached is true when the node may have created the volume's
	// VolumeAttachment itself (self-attach mode): it must delete it once
	// the volume is unstaged.
	SelfAttached bool
	// PublishContext came from the VolumeAttachment.
	PublishContext map[string]string
	// DeviceState is the state of the staged device.
	DeviceState podvol.MountState
	// DeviceMountPath is the staging path ("" when the driver does not stage).
	DeviceMountPath string
	// SELinuxContext is the SELinux context the device was (or is being)
	// staged with, "" for none.
	SELinuxContext string
	// Pods maps each pod that may have the volume published to its mount.
	Pods map[types.UID]PodMount
	// Size is the size in bytes this node has the volume at, as far as
	// node expansion goes (the kubelet's persistentVolumeSize): the
	// claim's status capacity when the volume was first set up here (or
	// found again after a restart), then the size of each node expansion
	// that grew it here (one that ended without growing it is held by the
	// loop instead: the node has not that size). 0 while not known. A volume that another node (or the
	// controller alone) grew is below its claim's size here until this
	// node has expanded its own view of it (ReadWriteMany).
	Size int64
}

// PodMount is one pod's mount of a volume.
type PodMount struct {
	Volume podvol.PodVolume
	State  podvol.MountState
	// Path is where the volume was published for the pod.
	Path string
	// Busy is true while an operation on this mount runs: whatever State
	// says, the volume may be mounted (a NodePublishVolume in flight).
	Busy bool
	// Found is true for an Uncertain mount found on disk at start
	// (reconstruction) that has not been Mounted or NotMounted since: the
	// pod may be using what an earlier run published (the kubelet's
	// IsVolumeReconstructed: Uncertain and foundDuringReconstruction).
	Found bool
}

// MayBeMounted reports whether the pod may have the volume mounted: it is
// Mounted or Uncertain, or an operation on it is running.
func (m PodMount) MayBeMounted() bool { return m.Busy || m.State.MayBeMounted() }

// ActualStateOfWorld holds what is really attached, staged and published on
// this node. The reconciler is its only writer; queries may come from
// anywhere. Waiters for a pod are woken by PodChanged.
type ActualStateOfWorld struct {
	mu      sync.RWMutex
	volumes map[podvol.UniqueVolumeName]*ActualVolume
	// pods indexes each pod's volumes: a slice, not a set, because a pod
	// has a few volumes and a map keeps room for 8 from its first entry
	// (about 200 bytes for a pod with one volume, 16 for the slice).
	pods    map[types.UID][]podvol.UniqueVolumeName
	waiters podwait.Set
	// the maps' peaks, to give their room back after many volumes went (shrink)
	volumesPeak, podsPeak shrinking
}

// NewActualStateOfWorld returns an empty actual state.
func NewActualStateOfWorld() *ActualStateOfWorld {
	return &ActualStateOfWorld{
		volumes: map[podvol.UniqueVolumeName]*ActualVolume{},
		pods:    map[types.UID][]podvol.UniqueVolumeName{},
	}
}

// Volume returns a snapshot of one volume; ok is false when nothing is known of it.
func (a *ActualStateOfWorld) Volume(name podvol.UniqueVolumeName) (ActualVolume, bool) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	v := a.volumes[name]
	if v == nil {
		return ActualVolume{}, false
	}
	out := *v
	out.Pods = make(map[types.UID]PodMount, len(v.Pods))
	for k, p := range v.Pods {
		out.Pods[k] = p
	}
	return out, true
}

// Spec returns the spec of a volume the actual state knows of, without
// its pods; ok is false when nothing is known of it.
func (a *ActualStateOfWorld) Spec(name podvol.UniqueVolumeName) (podvol.VolumeSpec, bool) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if v := a.volumes[name]; v != nil {
		return v.Spec, true
	}
	return podvol.VolumeSpec{}, false
}

func (a *ActualStateOfWorld) volume(spec podvol.VolumeSpec) *ActualVolume {
	v := a.volumes[spec.Name]
	if v == nil {
		v = &ActualVolume{Spec: spec, Pods: map[types.UID]PodMount{}}
		a.volumes[spec.Name] = v
		a.volumesPeak.peak = max(a.volumesPeak.peak, len(a.volumes))
	}
	return v
}

// MarkAttached records that the volume is attached (or needs no attach).
func (a *ActualStateOfWorld) MarkAttached(spec podvol.VolumeSpec, publishContext map[string]string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	v := a.volume(spec)
	v.Attached = true
	v.PublishContext = publishContext
	a.wakeVolume(v)
}

// SetSelfAttached records whether the node may have created the volume's
// VolumeAttachment itself. Clearing it also clears Attached: the
// attachment is gone.
func (a *ActualStateOfWorld) SetSelfAttached(spec podvol.VolumeSpec, created bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	v := a.volume(spec)
	v.SelfAttached = created
	if !created {
		v.Attached, v.PublishContext = false, nil
	}
	a.wakeVolume(v)
}

// SetDeviceState records the state of the volume's staged device.
func (a *ActualStateOfWorld) SetDeviceState(spec podvol.VolumeSpec, state podvol.MountState, deviceMountPath string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	v := a.volume(spec)
	v.DeviceState = state
	if deviceMountPath != "" || state == podvol.NotMounted {
		v.DeviceMountPath = deviceMountPath
	}
	a.wakeVolume(v)
}

// SetSize records the size this node has the volume at (ActualVolume.Size);
// nothing for a volume not known.
func (a *ActualStateOfWorld) SetSize(name podvol.UniqueVolumeName, size int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if v := a.volumes[name]; v != nil {
		v.Size = size
	}
}

// SetDeviceSELinuxContext records the SELinux context the volume's device
// is staged with.
func (a *ActualStateOfWorld) SetDeviceSELinuxContext(spec podvol.VolumeSpec, context string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.volume(spec).SELinuxContext = context
}

// SetPodMount records the state of a pod's mount of a volume after an
// operation (it clears Busy). A mount found on disk stays Found while it
// is Uncertain.
func (a *ActualStateOfWorld) SetPodMount(spec podvol.VolumeSpec, vol podvol.PodVolume, state podvol.MountState, path string) {
	a.setPodMount(spec, vol, state, path, false)
}

// SetFoundPodMount records a pod's mount of a volume found on disk at
// start, in the state reconstruction gave it: an Uncertain one is Found
// until it is Mounted or NotMounted.
func (a *ActualStateOfWorld) SetFoundPodMount(spec podvol.VolumeSpec, vol podvol.PodVolume, state podvol.MountState, path string) {
	a.setPodMount(spec, vol, state, path, true)
}

func (a *ActualStateOfWorld) setPodMount(spec podvol.VolumeSpec, vol podvol.PodVolume, state podvol.MountState, path string, found bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	v := a.volume(spec)
	pm := v.Pods[vol.Pod.UID]
	pm.Volume, pm.State, pm.Busy = vol, state, false
	pm.Found = (pm.Found || found) && state == podvol.Uncertain
	if path != "" {
		pm.Path = path
	}
	a.putPodMount(v, pm)
}

// putPodMount stores a pod's mount of v, indexes it by pod and wakes the
// pod's waiters; a.mu is held.
func (a *ActualStateOfWorld) putPodMount(v *ActualVolume, pm PodMount) {
	uid := pm.Volume.Pod.UID
	v.Pods[uid] = pm
	idx, known := a.pods[uid]
	if !slices.Contains(idx, v.Spec.Name) {
		a.pods[uid] = append(idx, v.Spec.Name)
		if !known {
			a.podsPeak.peak = max(a.podsPeak.peak, len(a.pods))
		}
	}
	a.wake(uid)
}

// SetPodBusy marks the start (busy) or the end of an operation on a pod's
// mount of a volume. A mount that is not busy and NotMounted is forgotten.
func (a *ActualStateOfWorld) SetPodBusy(spec podvol.VolumeSpec, vol podvol.PodVolume, busy bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !busy {
		v := a.volumes[spec.Name]
		if v == nil {
			return
		}
		pm, ok := v.Pods[vol.Pod.UID]
		if !ok {
			return
		}
		if pm.State == podvol.NotMounted {
			a.deletePodMount(spec.Name, vol.Pod.UID)
			return
		}
		pm.Busy = false
		a.putPodMount(v, pm)
		return
	}
	v := a.volume(spec)
	pm, ok := v.Pods[vol.Pod.UID]
	if !ok {
		pm.Volume = vol
	}
	pm.Busy = true
	a.putPodMount(v, pm)
}

// DeletePodMount forgets a pod's mount of a volume (it is unmounted).
func (a *ActualStateOfWorld) DeletePodMount(name podvol.UniqueVolumeName, uid types.UID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.deletePodMount(name, uid)
}

func (a *ActualStateOfWorld) deletePodMount(name podvol.UniqueVolumeName, uid types.UID) {
	if v := a.volumes[name]; v != nil {
		delete(v.Pods, uid)
	}
	if a.unindex(uid, name) {
		a.pods = shrink(&a.podsPeak, a.pods)
	}
	a.wake(uid)
}

// unindex removes volume name from the pod's index, and the pod once it has
// no volume left (it reports that); a.mu is held.
func (a *ActualStateOfWorld) unindex(uid types.UID, name podvol.UniqueVolumeName) bool {
	idx, known := a.pods[uid]
	if !known {
		return false
	}
	if i := slices.Index(idx, name); i >= 0 {
		idx = slices.Delete(idx, i, i+1)
	}
	if len(idx) == 0 {
		delete(a.pods, uid)
		return true
	}
	a.pods[uid] = idx
	return false
}

// DeleteVolume forgets a volume entirely: nothing of it is left on the node.
func (a *ActualStateOfWorld) DeleteVolume(name podvol.UniqueVolumeName) {
	a.mu.Lock()
	defer a.mu.Unlock()
	v := a.volumes[name]
	if v == nil {
		return
	}
	for uid := range v.Pods {
		a.unindex(uid, name)
		a.wake(uid)
	}
	a.pods = shrink(&a.podsPeak, a.pods)
	delete(a.volumes, name)
	a.volumes = shrink(&a.volumesPeak, a.volumes)
}

// PodVolumes returns the volumes a pod may have mounted (Mounted or
// Uncertain, or with an operation running), sorted by spec name.
func (a *ActualStateOfWorld) PodVolumes(uid types.UID) []podvol.MountedVolume {
	a.mu.RLock()
	defer a.mu.RUnlock()
	var out []podvol.MountedVolume
	for _, name := range a.pods[uid] {
		v := a.volumes[name]
		if v == nil {
			continue
		}
		pm, ok := v.Pods[uid]
		if !ok || !pm.MayBeMounted() {
			continue
		}
		out = append(out, podvol.MountedVolume{
			Name: name, SpecName: pm.Volume.SpecName, DirName: ondisk.VolumeDirName(&v.Spec, pm.Volume), Plugin: v.Spec.PluginName(), Driver: v.Spec.Driver,
			State: pm.State, Path: pm.Path, Block: v.Spec.Mode == podvol.Block, ReadOnly: pm.Volume.ReadOnly || v.Spec.ReadOnly,
			SELinuxContext: pm.Volume.SELinuxLabel,
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].SpecName < out[j].SpecName })
	return out
}

// VolumeNames returns every volume the actual state knows of.
func (a *ActualStateOfWorld) VolumeNames() []podvol.UniqueVolumeName {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return slices.AppendSeq(make([]podvol.UniqueVolumeName, 0, len(a.volumes)), maps.Keys(a.volumes))
}

// PodChanged returns a channel that is closed at the next change to any of
// the pod's mounts. Waiters take a new channel after each wake-up, and give
// each back with PodWaitDone when they stop waiting.
func (a *ActualStateOfWorld) PodChanged(uid types.UID) <-chan struct{} {
	return a.waiters.ChangedUnder(&a.mu, uid)
}

// PodWaitDone gives back a channel from PodChanged: once no one waits on
// it, it is dropped instead of being kept until the pod's next change
// (for a mounted pod, as long as it runs).
func (a *ActualStateOfWorld) PodWaitDone(uid types.UID, ch <-chan struct{}) {
	a.waiters.DoneUnder(&a.mu, uid, ch)
}

// wakeVolume wakes the waiters of every pod of v: a device change matters to all of them.
func (a *ActualStateOfWorld) wakeVolume(v *ActualVolume) {
	for uid := range v.Pods {
		a.wake(uid)
	}
}

func (a *ActualStateOfWorld) wake(uid types.UID) { a.waiters.Wake(uid) }
