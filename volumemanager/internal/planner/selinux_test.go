package planner

import (
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/podvol"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
	"github.com/nodevol/nodevol/volumemanager/internal/state"
)

func TestAdmitSELinux(t *testing.T) {
	const name = podvol.UniqueVolumeName("kubernetes.io/csi/drv^h")
	pv := func(pod, label string) podvol.PodVolume {
		return podvol.PodVolume{Pod: podvol.PodRef{UID: types.UID("uid-" + pod), Namespace: "ns", Name: pod}, SpecName: "data", SELinuxLabel: label}
	}
	mounted := func(p podvol.PodVolume, st podvol.MountState) state.PodMount {
		return state.PodMount{Volume: p, State: st}
	}
	for _, tc := range []struct {
		name string
		v    View
		want string
		// refused: pod -> the pod it is told it conflicts with
		refused map[string]string
	}{
		{name: "nothing done: the first pod in UID order sets the context",
			v:    View{Caps: attachStage, Desired: []podvol.PodVolume{pv("a", "X"), pv("b", "Y"), pv("c", "X")}},
			want: "X", refused: map[string]string{"b": "a"}},
		{name: "a mounted pod keeps its context",
			v: View{Caps: attachStage, Desired: []podvol.PodVolume{pv("a", "X"), pv("b", "Y")}, Known: true,
				Actual: state.ActualVolume{DeviceState: podvol.Mounted, SELinuxContext: "Y", Pods: map[types.UID]state.PodMount{"uid-b": mounted(pv("b", "Y"), podvol.Mounted)}}},
			want: "Y", refused: map[string]string{"a": "b"}},
		{name: "a publish in flight counts as mounted",
			v: View{Caps: attachStage, Desired: []podvol.PodVolume{pv("a", "X"), pv("b", "Y")}, Known: true,
				Actual: state.ActualVolume{DeviceState: podvol.Mounted, SELinuxContext: "Y", Pods: map[types.UID]state.PodMount{"uid-b": {Volume: pv("b", "Y"), Busy: true}}}},
			want: "Y", refused: map[string]string{"a": "b"}},
		{name: "the staged device's context wins over UID order",
			v: View{Caps: attachStage, Desired: []podvol.PodVolume{pv("a", "X"), pv("b", "Y")}, Known: true,
				Actual: state.ActualVolume{DeviceState: podvol.Uncertain, SELinuxContext: "Y"}},
			want: "Y", refused: map[string]string{"a": "b"}},
		{name: "a stage in flight fixes the context",
			v: View{Name: name, Desired: []podvol.PodVolume{pv("a", "X"), pv("b", "Y")}, Known: true,
				Actual:   state.ActualVolume{SELinuxContext: "Y"},
				InFlight: map[oe.Key]oe.OpKind{{Volume: name}: oe.OpStage}},
			want: "Y", refused: map[string]string{"a": "b"}},
		{name: "a device unstaged: its old context does not count",
			v: View{Caps: attachStage, Desired: []podvol.PodVolume{pv("a", "X"), pv("b", "Y")}, Known: true,
				Actual: state.ActualVolume{DeviceState: podvol.NotMounted, SELinuxContext: "Y"}},
			want: "X", refused: map[string]string{"b": "a"}},
		{name: "a device staged with a context no pod wants: the new one, no refusal (restaged)",
			v: View{Caps: attachStage, Desired: []podvol.PodVolume{pv("b", "Y")}, Known: true,
				Actual: state.ActualVolume{DeviceState: podvol.Mounted, SELinuxContext: "X"}},
			want: "Y"},
		{name: "no context and a context conflict",
			v:    View{Caps: attachStage, Desired: []podvol.PodVolume{pv("a", ""), pv("b", "Y")}},
			want: "", refused: map[string]string{"b": "a"}},
		{name: "all agree", v: View{Caps: attachStage, Desired: []podvol.PodVolume{pv("a", "X"), pv("b", "X")}}, want: "X"},
		{name: "nobody wants it", v: View{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.v.Name == "" {
				tc.v.Name = name
			}
			tc.v.Spec.Driver = "drv"
			got := admitSELinux(tc.v)
			if got.Context != tc.want {
				t.Errorf("context %q, want %q", got.Context, tc.want)
			}
			refused := map[string]string{}
			for uid, e := range got.Refused {
				if e.Pod.UID != uid || e.Volume != name || e.Driver != "drv" {
					t.Errorf("conflict of %s: %+v", uid, e)
				}
				refused[e.Pod.Name] = e.Other.Name
				if e.OtherContext != got.Context {
					t.Errorf("conflict of %s names context %q, want %q", uid, e.OtherContext, got.Context)
				}
			}
			if len(tc.refused) == 0 {
				tc.refused = map[string]string{}
			}
			if !reflect.DeepEqual(refused, tc.refused) {
				t.Errorf("refused %v, want %v", refused, tc.refused)
			}
		})
	}
}

func TestSELinuxConflictErrorText(t *testing.T) {
	e := &SELinuxConflictError{Volume: "kubernetes.io/csi/drv^h", Driver: "drv",
		Pod: podvol.PodRef{Namespace: "ns", Name: "b"}, Context: "system_u:object_r:container_file_t:s0:c3,c4",
		Other: podvol.PodRef{Namespace: "ns", Name: "a"}}
	want := `conflicting SELinux labels of volume kubernetes.io/csi/drv^h (driver drv): pod ns/b would mount it with SELinux context "system_u:object_r:container_file_t:s0:c3,c4", ` +
		`but pod ns/a uses it with no SELinux context; a volume is mounted with one context at a time, so pod ns/b waits until the volume is no longer used by pod ns/a`
	if e.Error() != want {
		t.Errorf("got\n%s\nwant\n%s", e.Error(), want)
	}
}
