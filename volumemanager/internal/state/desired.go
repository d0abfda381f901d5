package state

import (
	"cmp"
	"maps"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/podvol"
)

// DesiredVolume is one volume of one pod, resolved: what the pod wants mounted.
type DesiredVolume struct {
	Spec   podvol.VolumeSpec
	Volume podvol.PodVolume
	// SELinuxAdmitted: the pod has an SELinux label its volume's plugin
	// would mount it with, were it a PV (Volume.SELinuxLabel is that
	// label for a PV): the kubelet counts such a volume as admitted when
	// it enters the desired state. Not stored.
	SELinuxAdmitted bool
	// Now is the time of the SetPod call: a pod volume new to the desired
	// state is wanted since then (WantedSince); a pod volume already there
	// keeps the time it had.
	Now time.Time
}

// DesiredStateOfWorld holds the pods on this node and the CSI volumes they
// want mounted. It is written by the populator and read by the reconciler.
// Every change reports the volumes it touched to the notify function, so that
// the reconciler only looks at what changed.
type DesiredStateOfWorld struct {
	mu      sync.RWMutex
	notify  func(podvol.UniqueVolumeName)
	volumes map[podvol.UniqueVolumeName]*desiredVolume
	pods    map[types.UID]*desiredPod
	byPV    map[string]podvol.UniqueVolumeName
	// the maps' peaks, to give their room back after many pods left (shrink)
	volumesPeak, podsPeak, byPVPeak shrinking
}

type desiredVolume struct {
	spec podvol.VolumeSpec
	// pods holds pointers: a map keeps room for 8 entries from its first,
	// and most volumes have one pod; 8 slots of PodVolume values take about
	// 1.1 KiB per volume, 8 slots of pointers 200 bytes (and the one
	// PodVolume 120). A stored PodVolume is never changed.
	pods map[types.UID]*wantedVolume
}

// wantedVolume is one pod's volume and since when the pod has wanted it
// (Unix nanoseconds: 8 bytes, where a time.Time takes 24).
type wantedVolume struct {
	podvol.PodVolume
	since int64
}

type desiredPod struct {
	ref podvol.PodRef
	// wanted lists every CSI volume (by spec name) the pod needs, resolved or not.
	wanted []string
	// volumes maps a resolved spec name to its volume. Several spec names
	// may map to one volume (a PVC in two of the pod's volumes): the pod
	// has it mounted once, and each name sees that mount.
	volumes map[string]podvol.UniqueVolumeName
	// readOnly lists the spec names that ask for read-only but share their
	// volume's mount with a name that writes (nil for most pods): the
	// mount is writable, and these names are read-only for the containers.
	readOnly []string
	// errs holds why a spec name could not be resolved.
	errs map[string]error
}

// NewDesiredStateOfWorld returns an empty desired state. notify, if not nil,
// is called (without locks held) with every volume a change touched.
func NewDesiredStateOfWorld(notify func(podvol.UniqueVolumeName)) *DesiredStateOfWorld {
	if notify == nil {
		notify = func(podvol.UniqueVolumeName) {}
	}
	return &DesiredStateOfWorld{
		notify:  notify,
		volumes: map[podvol.UniqueVolumeName]*desiredVolume{},
		pods:    map[types.UID]*desiredPod{},
		byPV:    map[string]podvol.UniqueVolumeName{},
	}
}

// SetPod replaces everything known about a pod: wanted lists the spec names
// of all CSI volumes it needs, resolved the ones that could be resolved, and
// errs why the others could not. Volumes the pod no longer has lose it.
//
// Several resolved spec names may be one volume (a PVC in two of the pod's
// volumes, or a claim and a generic ephemeral volume of the same PVC): the
// pod wants it mounted once, with the first of its spec names (in resolved
// order) and its SELinux label, read-only only when every name asks for
// read-only (a name that writes needs a writable mount).
func (d *DesiredStateOfWorld) SetPod(pod podvol.PodRef, wanted []string, resolved []DesiredVolume, errs map[string]error) {
	var touched []podvol.UniqueVolumeName
	d.mu.Lock()
	old := d.pods[pod.UID]
	p := &desiredPod{ref: pod, wanted: append([]string(nil), wanted...), volumes: make(map[string]podvol.UniqueVolumeName, len(resolved))}
	if len(errs) > 0 { // most pods have none: no map for them
		p.errs = make(map[string]error, len(errs))
		for k, v := range errs {
			p.errs[k] = v
		}
	}
	mounts := mergePodVolumes(pod, resolved, p)
	for i, dv := range resolved {
		name := dv.Spec.Name
		if mounts[i] == nil {
			continue // another spec name of the same volume holds its mount
		}
		v := d.volumes[name]
		if v == nil {
			v = &desiredVolume{pods: map[types.UID]*wantedVolume{}}
			d.volumes[name] = v
		}
		v.spec = dv.Spec
		if dv.Spec.PVName != "" {
			d.byPV[dv.Spec.PVName] = name
		}
		since := dv.Now.UnixNano()
		cur, ok := v.pods[pod.UID]
		if ok {
			since = cur.since
		}
		if !ok || !samePodVolume(cur.PodVolume, *mounts[i]) {
			touched = append(touched, name)
		}
		v.pods[pod.UID] = &wantedVolume{PodVolume: *mounts[i], since: since}
	}
	if old != nil {
		for _, name := range podVolumeNames(old) {
			if !hasVolume(p, name) {
				d.removePodFromVolume(name, pod.UID)
				touched = append(touched, name)
			}
		}
	}
	d.pods[pod.UID] = p
	d.shrink()
	d.mu.Unlock()
	for _, name := range touched {
		d.notify(name)
	}
}

// mergePodVolumes fills p.volumes and p.readOnly from resolved, and
// returns the mount of each volume at the index of its first spec name
// (nil at the others'), each with the pod set.
func mergePodVolumes(pod podvol.PodRef, resolved []DesiredVolume, p *desiredPod) []*podvol.PodVolume {
	mounts := make([]*podvol.PodVolume, len(resolved))
	// first[i] is the index of the first spec name of resolved[i]'s volume.
	first := make([]int, len(resolved))
	for i, dv := range resolved {
		p.volumes[dv.Volume.SpecName] = dv.Spec.Name
		first[i] = slices.IndexFunc(resolved[:i+1], func(o DesiredVolume) bool { return o.Spec.Name == dv.Spec.Name })
		if first[i] == i {
			pv := dv.Volume
			pv.Pod = pod
			mounts[i] = &pv
			continue
		}
		m := mounts[first[i]]
		m.ReadOnly = m.ReadOnly && dv.Volume.ReadOnly
	}
	for i, dv := range resolved {
		if dv.Volume.ReadOnly && !mounts[first[i]].ReadOnly {
			p.readOnly = append(p.readOnly, dv.Volume.SpecName)
		}
	}
	return mounts
}

// podVolumeNames returns the pod's volumes, each once.
func podVolumeNames(p *desiredPod) []podvol.UniqueVolumeName {
	out := make([]podvol.UniqueVolumeName, 0, len(p.volumes))
	for _, name := range p.volumes {
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}

func hasVolume(p *desiredPod, name podvol.UniqueVolumeName) bool {
	for _, n := range p.volumes {
		if n == name {
			return true
		}
	}
	return false
}

// DeletePod removes a pod and its claim on every volume.
func (d *DesiredStateOfWorld) DeletePod(uid types.UID) {
	d.mu.Lock()
	p := d.pods[uid]
	if p == nil {
		d.mu.Unlock()
		return
	}
	delete(d.pods, uid)
	touched := podVolumeNames(p)
	for _, name := range touched {
		d.removePodFromVolume(name, uid)
	}
	d.shrink()
	d.mu.Unlock()
	for _, name := range touched {
		d.notify(name)
	}
}

// shrink gives back the room of the maps' deleted entries once they hold a
// quarter of what they held. Called with d.mu held, after every change.
func (d *DesiredStateOfWorld) shrink() {
	d.volumes = shrink(&d.volumesPeak, d.volumes)
	d.pods = shrink(&d.podsPeak, d.pods)
	d.byPV = shrink(&d.byPVPeak, d.byPV)
}

func (d *DesiredStateOfWorld) removePodFromVolume(name podvol.UniqueVolumeName, uid types.UID) {
	v := d.volumes[name]
	if v == nil {
		return
	}
	delete(v.pods, uid)
	if len(v.pods) == 0 {
		delete(d.volumes, name)
		if v.spec.PVName != "" && d.byPV[v.spec.PVName] == name {
			delete(d.byPV, v.spec.PVName)
		}
	}
}

func samePodVolume(a, b podvol.PodVolume) bool {
	return a.Pod == b.Pod && a.SpecName == b.SpecName && a.ReadOnly == b.ReadOnly &&
		a.SELinuxLabel == b.SELinuxLabel && ptrEq(a.FSGroup, b.FSGroup) && a.FSGroupOnRootMismatch == b.FSGroupOnRootMismatch
}

func ptrEq(a, b *int64) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// Volume returns the spec of a desired volume and the pods that want it.
// ok is false when no pod wants the volume.
func (d *DesiredStateOfWorld) Volume(name podvol.UniqueVolumeName) (spec podvol.VolumeSpec, pods []podvol.PodVolume, ok bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	v := d.volumes[name]
	if v == nil {
		return podvol.VolumeSpec{}, nil, false
	}
	pods = make([]podvol.PodVolume, 0, len(v.pods))
	for _, p := range v.pods {
		pods = append(pods, p.PodVolume)
	}
	slices.SortFunc(pods, func(a, b podvol.PodVolume) int { return cmp.Compare(a.Pod.UID, b.Pod.UID) }) // sort.Slice allocates; this is per plan
	return v.spec, pods, true
}

// WantedSince returns when the pod's volume entered the desired state (the
// Now of the SetPod that brought it); ok is false when the pod does not
// want the volume.
func (d *DesiredStateOfWorld) WantedSince(name podvol.UniqueVolumeName, uid types.UID) (since time.Time, ok bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if v := d.volumes[name]; v != nil {
		if p := v.pods[uid]; p != nil {
			return time.Unix(0, p.since), true
		}
	}
	return time.Time{}, false
}

// Spec returns the spec of a desired volume, without its pods.
func (d *DesiredStateOfWorld) Spec(name podvol.UniqueVolumeName) (podvol.VolumeSpec, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if v := d.volumes[name]; v != nil {
		return v.spec, true
	}
	return podvol.VolumeSpec{}, false
}

// VolumeForPV returns the desired volume backed by the named PV.
func (d *DesiredStateOfWorld) VolumeForPV(pvName string) (podvol.UniqueVolumeName, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	name, ok := d.byPV[pvName]
	return name, ok
}

// VolumeNames returns every desired volume, for a periodic resync.
func (d *DesiredStateOfWorld) VolumeNames() []podvol.UniqueVolumeName {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return slices.AppendSeq(make([]podvol.UniqueVolumeName, 0, len(d.volumes)), maps.Keys(d.volumes))
}

// VolumesOfDriver returns every desired volume of a driver.
func (d *DesiredStateOfWorld) VolumesOfDriver(driver string) []podvol.UniqueVolumeName {
	d.mu.RLock()
	defer d.mu.RUnlock()
	var out []podvol.UniqueVolumeName
	for name, v := range d.volumes {
		if v.spec.Driver == driver {
			out = append(out, name)
		}
	}
	return out
}

// PodState is what the desired state knows about one pod.
type PodState struct {
	Pod podvol.PodRef
	// Wanted lists the spec names of every CSI volume the pod needs.
	Wanted []string
	// Volumes maps each resolved spec name to its volume.
	Volumes map[string]podvol.UniqueVolumeName
	// Errors maps each unresolved spec name to the reason.
	Errors map[string]error
	// Shared maps each spec name that shares its volume's mount with an
	// earlier spec name of the pod to the name the mount carries (the
	// name operations and their errors go by); nil when no two names
	// share a volume.
	Shared map[string]string
}

// Pod returns a copy of what is known about a pod.
func (d *DesiredStateOfWorld) Pod(uid types.UID) (PodState, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	p := d.pods[uid]
	if p == nil {
		return PodState{}, false
	}
	st := PodState{Pod: p.ref, Wanted: append([]string(nil), p.wanted...), Volumes: make(map[string]podvol.UniqueVolumeName, len(p.volumes)), Errors: make(map[string]error, len(p.errs))}
	for k, v := range p.volumes {
		st.Volumes[k] = v
	}
	for k, v := range p.errs {
		st.Errors[k] = v
	}
	if len(p.volumes) > len(podVolumeNames(p)) {
		st.Shared = map[string]string{}
		for k, name := range p.volumes {
			if pv := d.volumes[name].pods[uid]; pv.SpecName != k {
				st.Shared[k] = pv.SpecName
			}
		}
	}
	return st, true
}

// SpecName is one of the names (in pod.spec.volumes) under which a pod
// wants a volume.
type SpecName struct {
	Name string
	// ReadOnly: the name asks for read-only, although the pod's one mount
	// of the volume is writable because another of its names writes.
	ReadOnly bool
}

// SpecNames returns the names under which pod uid wants volume name, in
// pod.spec.volumes order; none when it does not want it.
func (d *DesiredStateOfWorld) SpecNames(uid types.UID, name podvol.UniqueVolumeName) []SpecName {
	d.mu.RLock()
	defer d.mu.RUnlock()
	p := d.pods[uid]
	if p == nil {
		return nil
	}
	var out []SpecName
	for _, n := range p.wanted {
		if v, ok := p.volumes[n]; ok && v == name {
			out = append(out, SpecName{Name: n, ReadOnly: slices.Contains(p.readOnly, n)})
		}
	}
	return out
}

// PodsWithErrors returns the pods that have volumes that could not be resolved.
func (d *DesiredStateOfWorld) PodsWithErrors() []podvol.PodRef {
	d.mu.RLock()
	defer d.mu.RUnlock()
	var out []podvol.PodRef
	for _, p := range d.pods {
		if len(p.errs) > 0 {
			out = append(out, p.ref)
		}
	}
	return out
}
