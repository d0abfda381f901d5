package state

import (
	"errors"
	"reflect"
	"sort"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/podvol"
)

func spec(driver, handle, pv string) podvol.VolumeSpec {
	return podvol.VolumeSpec{Name: podvol.CSIVolumeName(driver, handle), Driver: driver, VolumeHandle: handle, PVName: pv, Mode: podvol.Filesystem}
}

func pod(uid string) podvol.PodRef {
	return podvol.PodRef{UID: types.UID(uid), Namespace: "ns", Name: "pod-" + uid}
}

type recorder struct {
	mu    sync.Mutex
	names []podvol.UniqueVolumeName
}

func (r *recorder) notify(n podvol.UniqueVolumeName) {
	r.mu.Lock()
	r.names = append(r.names, n)
	r.mu.Unlock()
}
func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, len(r.names))
	for i, n := range r.names {
		out[i] = string(n)
	}
	r.names = nil
	sort.Strings(out)
	return out
}

func TestDesiredSetPodAndDelete(t *testing.T) {
	r := &recorder{}
	d := NewDesiredStateOfWorld(r.notify)
	a, b := spec("drv", "a", "pv-a"), spec("drv", "b", "pv-b")

	d.SetPod(pod("1"), []string{"va", "vb", "vc"}, []DesiredVolume{
		{Spec: a, Volume: podvol.PodVolume{SpecName: "va"}},
		{Spec: b, Volume: podvol.PodVolume{SpecName: "vb"}},
	}, map[string]error{"vc": errors.New("pvc pending")})
	if got := r.take(); !reflect.DeepEqual(got, []string{string(a.Name), string(b.Name)}) {
		t.Fatalf("notified %v", got)
	}
	// The same set again changes nothing and notifies nothing.
	d.SetPod(pod("1"), []string{"va", "vb", "vc"}, []DesiredVolume{
		{Spec: a, Volume: podvol.PodVolume{SpecName: "va"}},
		{Spec: b, Volume: podvol.PodVolume{SpecName: "vb"}},
	}, nil)
	if got := r.take(); len(got) != 0 {
		t.Fatalf("unchanged pod notified %v", got)
	}
	// A second pod shares volume a.
	d.SetPod(pod("2"), []string{"x"}, []DesiredVolume{{Spec: a, Volume: podvol.PodVolume{SpecName: "x", ReadOnly: true}}}, nil)
	_, pods, ok := d.Volume(a.Name)
	if !ok || len(pods) != 2 || pods[1].Pod.UID != "2" || !pods[1].ReadOnly {
		t.Fatalf("volume a pods = %+v", pods)
	}
	// Pod 1 drops volume b.
	r.take()
	d.SetPod(pod("1"), []string{"va"}, []DesiredVolume{{Spec: a, Volume: podvol.PodVolume{SpecName: "va"}}}, nil)
	if got := r.take(); !reflect.DeepEqual(got, []string{string(b.Name)}) {
		t.Fatalf("notified %v", got)
	}
	if _, _, ok := d.Volume(b.Name); ok {
		t.Fatal("volume b still desired")
	}
	if _, ok := d.VolumeForPV("pv-b"); ok {
		t.Fatal("pv index kept pv-b")
	}
	if n, ok := d.VolumeForPV("pv-a"); !ok || n != a.Name {
		t.Fatalf("VolumeForPV(pv-a) = %q %v", n, ok)
	}
	d.DeletePod("1")
	if _, pods, _ := d.Volume(a.Name); len(pods) != 1 {
		t.Fatalf("pods after delete = %v", pods)
	}
	d.DeletePod("2")
	if len(d.VolumeNames()) != 0 {
		t.Fatalf("volumes left: %v", d.VolumeNames())
	}
	d.DeletePod("unknown") // no-op
}

func TestDesiredPodState(t *testing.T) {
	d := NewDesiredStateOfWorld(nil)
	a := spec("drv", "a", "")
	d.SetPod(pod("1"), []string{"va", "vb"}, []DesiredVolume{{Spec: a, Volume: podvol.PodVolume{SpecName: "va"}}}, map[string]error{"vb": errors.New("boom")})
	st, ok := d.Pod("1")
	if !ok || st.Volumes["va"] != a.Name || st.Errors["vb"] == nil || len(st.Wanted) != 2 {
		t.Fatalf("pod state %+v", st)
	}
	if got := d.PodsWithErrors(); len(got) != 1 {
		t.Fatalf("PodsWithErrors = %v", got)
	}
	if got := d.VolumesOfDriver("drv"); len(got) != 1 {
		t.Fatalf("VolumesOfDriver = %v", got)
	}
}

func TestActualStates(t *testing.T) {
	a := NewActualStateOfWorld()
	s := spec("drv", "a", "pv")
	p1 := podvol.PodVolume{Pod: pod("1"), SpecName: "v"}
	ch := a.PodChanged("1")

	a.MarkAttached(s, map[string]string{"k": "v"})
	a.SetDeviceState(s, podvol.Uncertain, "/stage")
	a.SetDeviceState(s, podvol.Mounted, "")
	a.SetPodMount(s, p1, podvol.Mounted, "/pods/1/v")
	select {
	case <-ch:
	default:
		t.Fatal("pod waiter not woken")
	}
	v, ok := a.Volume(s.Name)
	if !ok || !v.Attached || v.DeviceState != podvol.Mounted || v.DeviceMountPath != "/stage" || v.PublishContext["k"] != "v" {
		t.Fatalf("volume %+v", v)
	}
	got := a.PodVolumes("1")
	want := []podvol.MountedVolume{{Name: s.Name, SpecName: "v", DirName: "pv", Plugin: podvol.CSIPluginName, Driver: "drv", State: podvol.Mounted, Path: "/pods/1/v"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("PodVolumes = %+v, want %+v", got, want)
	}
	// The snapshot is a copy.
	v.Pods["x"] = PodMount{}
	if v2, _ := a.Volume(s.Name); len(v2.Pods) != 1 {
		t.Fatal("snapshot shares its map")
	}
	// Uncertain still counts as possibly mounted; NotMounted does not.
	a.SetPodMount(s, p1, podvol.Uncertain, "")
	if got := a.PodVolumes("1"); len(got) != 1 || got[0].State != podvol.Uncertain || got[0].Path != "/pods/1/v" {
		t.Fatalf("uncertain PodVolumes = %+v", got)
	}
	a.SetPodMount(s, p1, podvol.NotMounted, "")
	if got := a.PodVolumes("1"); len(got) != 0 {
		t.Fatalf("not-mounted PodVolumes = %+v", got)
	}
	a.DeletePodMount(s.Name, "1")
	a.SetDeviceState(s, podvol.NotMounted, "")
	if v, _ := a.Volume(s.Name); v.DeviceMountPath != "" || len(v.Pods) != 0 {
		t.Fatalf("after teardown %+v", v)
	}
	a.DeleteVolume(s.Name)
	if _, ok := a.Volume(s.Name); ok || len(a.VolumeNames()) != 0 {
		t.Fatal("volume not deleted")
	}
}

func TestConcurrentUse(t *testing.T) {
	d := NewDesiredStateOfWorld(func(podvol.UniqueVolumeName) {})
	a := NewActualStateOfWorld()
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			s := spec("drv", string(rune('a'+i)), "")
			p := pod(string(rune('a' + i)))
			for j := 0; j < 200; j++ {
				d.SetPod(p, []string{"v"}, []DesiredVolume{{Spec: s, Volume: podvol.PodVolume{SpecName: "v"}}}, nil)
				a.SetPodMount(s, podvol.PodVolume{Pod: p, SpecName: "v"}, podvol.Mounted, "/x")
				_ = a.PodVolumes(p.UID)
				_, _, _ = d.Volume(s.Name)
				a.DeletePodMount(s.Name, p.UID)
				d.DeletePod(p.UID)
			}
		}(i)
	}
	wg.Wait()
}

func TestPodBusy(t *testing.T) {
	a := NewActualStateOfWorld()
	spec := podvol.VolumeSpec{Name: "v", Driver: "d"}
	pv := podvol.PodVolume{Pod: podvol.PodRef{UID: "p"}, SpecName: "data"}
	changed := a.PodChanged("p")
	a.SetPodBusy(spec, pv, true)
	<-changed // a publish starting wakes the pod's waiters
	if got := a.PodVolumes("p"); len(got) != 1 || got[0].State != podvol.NotMounted {
		t.Fatalf("a publish in flight: %+v, want the volume listed as possibly mounted", got)
	}
	a.SetPodBusy(spec, pv, false) // a final error: nothing was mounted
	if got := a.PodVolumes("p"); len(got) != 0 {
		t.Fatalf("after a failed first publish: %+v, want nothing", got)
	}
	if v, _ := a.Volume("v"); len(v.Pods) != 0 {
		t.Fatalf("the pod's entry was kept: %+v", v.Pods)
	}
	a.SetPodMount(spec, pv, podvol.Mounted, "/m")
	a.SetPodBusy(spec, pv, true) // a republish
	a.SetPodBusy(spec, pv, false)
	if got := a.PodVolumes("p"); len(got) != 1 || got[0].State != podvol.Mounted || got[0].Path != "/m" {
		t.Fatalf("after a failed republish: %+v, want it still podvol.Mounted", got)
	}
}

// TestPodWaitDone: a channel given back is dropped once nobody waits on it,
// and one given back by one waiter still wakes another.
func TestPodWaitDone(t *testing.T) {
	a := NewActualStateOfWorld()
	s := spec("drv", "v", "pv")
	p := podvol.PodVolume{Pod: podvol.PodRef{UID: "p"}, SpecName: "data"}
	first, second := a.PodChanged("p"), a.PodChanged("p")
	a.PodWaitDone("p", first)
	a.SetPodMount(s, p, podvol.Mounted, "/pods/p/v")
	select {
	case <-second:
	default:
		t.Fatal("a change did not wake the waiter left")
	}
	ch := a.PodChanged("p")
	a.PodWaitDone("p", ch)
	if n := a.waiters.Len(); n != 0 {
		t.Fatalf("%d pods keep a channel nobody waits on", n)
	}
}

// TestFoundPodMount: a mount found on disk Uncertain stays Found through
// its busy spells and Uncertain outcomes, and stops being Found once it
// is Mounted or NotMounted; one found Mounted, or set by an operation, is
// never Found.
func TestFoundPodMount(t *testing.T) {
	s := spec("drv", "h", "pv")
	vol := podvol.PodVolume{Pod: pod("a"), SpecName: "data"}
	found := func(a *ActualStateOfWorld) bool {
		v, _ := a.Volume(s.Name)
		return v.Pods["a"].Found
	}
	for _, tc := range []struct {
		name  string
		steps func(a *ActualStateOfWorld)
		want  bool
	}{
		{"found Uncertain", func(a *ActualStateOfWorld) { a.SetFoundPodMount(s, vol, podvol.Uncertain, "/p") }, true},
		{"found Mounted", func(a *ActualStateOfWorld) { a.SetFoundPodMount(s, vol, podvol.Mounted, "/p") }, false},
		{"Uncertain after an operation", func(a *ActualStateOfWorld) { a.SetPodMount(s, vol, podvol.Uncertain, "/p") }, false},
		{"found, then busy and failed", func(a *ActualStateOfWorld) {
			a.SetFoundPodMount(s, vol, podvol.Uncertain, "/p")
			a.SetPodBusy(s, vol, true)
			a.SetPodBusy(s, vol, false)
		}, true},
		{"found, then Uncertain again", func(a *ActualStateOfWorld) {
			a.SetFoundPodMount(s, vol, podvol.Uncertain, "/p")
			a.SetPodMount(s, vol, podvol.Uncertain, "")
		}, true},
		{"found, then Mounted", func(a *ActualStateOfWorld) {
			a.SetFoundPodMount(s, vol, podvol.Uncertain, "/p")
			a.SetPodMount(s, vol, podvol.Mounted, "/p")
			a.SetPodMount(s, vol, podvol.Uncertain, "")
		}, false},
		{"found, then NotMounted", func(a *ActualStateOfWorld) {
			a.SetFoundPodMount(s, vol, podvol.Uncertain, "/p")
			a.SetPodMount(s, vol, podvol.NotMounted, "")
			a.SetPodMount(s, vol, podvol.Uncertain, "")
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := NewActualStateOfWorld()
			tc.steps(a)
			if got := found(a); got != tc.want {
				t.Errorf("Found = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestWantedSince: a pod volume is wanted since the SetPod that brought it,
// through later SetPods that change it or not, until the pod lets it go;
// brought again, it is wanted since then.
func TestWantedSince(t *testing.T) {
	d := NewDesiredStateOfWorld(nil)
	a := spec("drv", "a", "pv-a")
	t0 := time.Unix(100, 0)
	set := func(at time.Time, readOnly bool, vols ...string) {
		var resolved []DesiredVolume
		for _, v := range vols {
			resolved = append(resolved, DesiredVolume{Spec: a, Volume: podvol.PodVolume{SpecName: v, ReadOnly: readOnly}, Now: at})
		}
		d.SetPod(pod("1"), vols, resolved, nil)
	}
	for _, step := range []struct {
		name     string
		at       time.Time
		readOnly bool
		vols     []string
		want     time.Time // zero: not wanted
	}{
		{"brought", t0, false, []string{"va"}, t0},
		{"the same again", t0.Add(time.Second), false, []string{"va"}, t0},
		{"changed", t0.Add(2 * time.Second), true, []string{"va"}, t0},
		{"let go", t0.Add(3 * time.Second), false, nil, time.Time{}},
		{"brought again", t0.Add(4 * time.Second), false, []string{"va"}, t0.Add(4 * time.Second)},
	} {
		set(step.at, step.readOnly, step.vols...)
		got, ok := d.WantedSince(a.Name, "1")
		if ok != !step.want.IsZero() || !got.Equal(step.want) {
			t.Errorf("%s: WantedSince = %v, %t; want %v", step.name, got, ok, step.want)
		}
	}
}

// TestSize: the size the node has a volume at is kept with the volume and
// goes with it; a volume not known is not created by it.
func TestSize(t *testing.T) {
	a := NewActualStateOfWorld()
	s := spec("drv", "h-a", "pv-a")
	a.SetSize(s.Name, 1<<30)
	if _, ok := a.Volume(s.Name); ok {
		t.Fatal("SetSize created a volume")
	}
	a.SetDeviceState(s, podvol.Mounted, "/stage")
	a.SetSize(s.Name, 2<<30)
	if v, _ := a.Volume(s.Name); v.Size != 2<<30 {
		t.Errorf("size %d, want 2Gi", v.Size)
	}
	a.DeleteVolume(s.Name)
	a.SetDeviceState(s, podvol.Mounted, "/stage")
	if v, _ := a.Volume(s.Name); v.Size != 0 {
		t.Errorf("size %d after the volume went and came back, want 0 (not known)", v.Size)
	}
}
