package state

import (
	"reflect"
	"testing"

	"github.com/nodevol/nodevol/podvol"
)

// TestDesiredSameVolumeUnderTwoNames: a pod that has one PVC in two of its
// volumes wants the volume once, under both names; dropping one name keeps
// it, dropping both releases it.
func TestDesiredSameVolumeUnderTwoNames(t *testing.T) {
	data := spec("drv", "data", "pv-data")
	both := func(roA, roB bool) []DesiredVolume {
		return []DesiredVolume{
			{Spec: data, Volume: podvol.PodVolume{SpecName: "a", ReadOnly: roA}},
			{Spec: data, Volume: podvol.PodVolume{SpecName: "b", ReadOnly: roB}},
		}
	}
	tests := []struct {
		name       string
		roA, roB   bool
		wantRO     bool
		wantNames  []SpecName
		wantShared map[string]string
	}{
		{name: "both writable", wantNames: []SpecName{{Name: "a"}, {Name: "b"}}, wantShared: map[string]string{"b": "a"}},
		{name: "both read-only", roA: true, roB: true, wantRO: true, wantNames: []SpecName{{Name: "a"}, {Name: "b"}}, wantShared: map[string]string{"b": "a"}},
		// One name writes: the one mount is writable, the other name read-only for its containers.
		{name: "first read-only", roA: true, wantNames: []SpecName{{Name: "a", ReadOnly: true}, {Name: "b"}}, wantShared: map[string]string{"b": "a"}},
		{name: "second read-only", roB: true, wantNames: []SpecName{{Name: "a"}, {Name: "b", ReadOnly: true}}, wantShared: map[string]string{"b": "a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &recorder{}
			d := NewDesiredStateOfWorld(r.notify)
			d.SetPod(pod("1"), []string{"a", "b"}, both(tt.roA, tt.roB), nil)
			if got := r.take(); !reflect.DeepEqual(got, []string{string(data.Name)}) {
				t.Errorf("notified %v, want the volume once", got)
			}
			_, pods, ok := d.Volume(data.Name)
			if !ok || len(pods) != 1 || pods[0].SpecName != "a" || pods[0].ReadOnly != tt.wantRO || pods[0].Pod.UID != "1" {
				t.Fatalf("pods of the volume = %+v, want pod 1 once, as a, read-only %v", pods, tt.wantRO)
			}
			if got := d.SpecNames("1", data.Name); !reflect.DeepEqual(got, tt.wantNames) {
				t.Errorf("SpecNames = %+v, want %+v", got, tt.wantNames)
			}
			st, _ := d.Pod("1")
			if !reflect.DeepEqual(st.Shared, tt.wantShared) {
				t.Errorf("Shared = %v, want %v", st.Shared, tt.wantShared)
			}
			want := map[string]podvol.UniqueVolumeName{"a": data.Name, "b": data.Name}
			if !reflect.DeepEqual(st.Volumes, want) {
				t.Errorf("Volumes = %v, want %v", st.Volumes, want)
			}
		})
	}
}

func TestDesiredSameVolumeDropOneName(t *testing.T) {
	data := spec("drv", "data", "pv-data")
	r := &recorder{}
	d := NewDesiredStateOfWorld(r.notify)
	d.SetPod(pod("1"), []string{"a", "b"}, []DesiredVolume{
		{Spec: data, Volume: podvol.PodVolume{SpecName: "a"}},
		{Spec: data, Volume: podvol.PodVolume{SpecName: "b"}},
	}, nil)
	r.take()

	// a goes: the pod still wants the volume, now as b.
	d.SetPod(pod("1"), []string{"b"}, []DesiredVolume{{Spec: data, Volume: podvol.PodVolume{SpecName: "b"}}}, nil)
	_, pods, ok := d.Volume(data.Name)
	if !ok || len(pods) != 1 || pods[0].SpecName != "b" {
		t.Fatalf("after dropping a: pods of the volume = %+v (wanted %v), want pod 1 as b", pods, ok)
	}
	if got := d.SpecNames("1", data.Name); !reflect.DeepEqual(got, []SpecName{{Name: "b"}}) {
		t.Errorf("SpecNames = %+v, want b", got)
	}
	if _, ok := d.VolumeForPV("pv-data"); !ok {
		t.Error("the PV's volume is no longer found")
	}
	if st, _ := d.Pod("1"); st.Shared != nil {
		t.Errorf("Shared = %v, want none", st.Shared)
	}
	r.take()

	// Both back, then the pod goes: the volume is released once.
	d.SetPod(pod("1"), []string{"a", "b"}, []DesiredVolume{
		{Spec: data, Volume: podvol.PodVolume{SpecName: "a"}},
		{Spec: data, Volume: podvol.PodVolume{SpecName: "b"}},
	}, nil)
	r.take()
	d.DeletePod("1")
	if got := r.take(); !reflect.DeepEqual(got, []string{string(data.Name)}) {
		t.Errorf("DeletePod notified %v, want the volume once", got)
	}
	if _, _, ok := d.Volume(data.Name); ok {
		t.Error("volume still desired after its pod went")
	}
	if got := d.SpecNames("1", data.Name); got != nil {
		t.Errorf("SpecNames of a deleted pod = %+v", got)
	}

	// Dropping both names, the pod staying, releases it too.
	d.SetPod(pod("2"), []string{"a", "b"}, []DesiredVolume{
		{Spec: data, Volume: podvol.PodVolume{SpecName: "a"}},
		{Spec: data, Volume: podvol.PodVolume{SpecName: "b"}},
	}, nil)
	d.SetPod(pod("2"), nil, nil, nil)
	if _, _, ok := d.Volume(data.Name); ok {
		t.Error("volume still desired after the pod dropped both names")
	}
}
