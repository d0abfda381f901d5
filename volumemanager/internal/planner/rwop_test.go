package planner

import (
	"errors"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/podvol"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
	"github.com/nodevol/nodevol/volumemanager/internal/state"
)

func TestRWOPRefusals(t *testing.T) {
	pv := func(uid string) podvol.PodVolume {
		return podvol.PodVolume{Pod: podvol.PodRef{UID: types.UID(uid), Namespace: "ns", Name: uid}, SpecName: "data"}
	}
	rwop := podvol.VolumeSpec{Name: "v", PVName: "pv-1", Claim: "ns/c", AccessMode: string(v1.ReadWriteOncePod)}
	msg := func(refused, owner string) string {
		return "pod ns/" + refused + " cannot use volume pv-1 (claim ns/c): the volume has access mode ReadWriteOncePod and is in use by pod " + owner + " on this node; it is mounted once that pod has released it"
	}
	tests := []struct {
		name    string
		spec    podvol.VolumeSpec
		desired []podvol.PodVolume
		pods    map[types.UID]state.PodMount
		want    map[types.UID]string
		plan    string // the actions planned, staged and attached
	}{
		{name: "ReadWriteOnce: no refusal", spec: podvol.VolumeSpec{Name: "v", AccessMode: string(v1.ReadWriteOnce)},
			desired: []podvol.PodVolume{pv("a"), pv("b")}, plan: "volume_mount v pod=ns/a; volume_mount v pod=ns/b"},
		{name: "one pod", spec: rwop, desired: []podvol.PodVolume{pv("a")}, plan: "volume_mount v pod=ns/a"},
		{name: "mounted pod keeps it", spec: rwop, desired: []podvol.PodVolume{pv("a"), pv("b")},
			pods: map[types.UID]state.PodMount{"b": {Volume: pv("b"), State: podvol.Mounted}},
			want: map[types.UID]string{"a": msg("a", "ns/b")}},
		{name: "publish in flight keeps it", spec: rwop, desired: []podvol.PodVolume{pv("a"), pv("b")},
			pods: map[types.UID]state.PodMount{"b": {Volume: pv("b"), Busy: true}},
			want: map[types.UID]string{"a": msg("a", "ns/b")}},
		{name: "uncertain mount of a pod no longer wanting it keeps it", spec: rwop, desired: []podvol.PodVolume{pv("b")},
			pods: map[types.UID]state.PodMount{"a": {Volume: pv("a"), State: podvol.Uncertain}},
			want: map[types.UID]string{"b": msg("b", "ns/a")}, plan: "volume_unmount v pod=ns/a"},
		{name: "pod found on disk, known by UID only", spec: rwop, desired: []podvol.PodVolume{pv("b")},
			pods: map[types.UID]state.PodMount{"a": {Volume: podvol.PodVolume{Pod: podvol.PodRef{UID: "a"}}, State: podvol.Uncertain}},
			want: map[types.UID]string{"b": msg("b", "with UID a")}, plan: "volume_unmount v pod=with UID a"},
		{name: "failed publish does not keep it", spec: rwop, desired: []podvol.PodVolume{pv("a"), pv("b")},
			pods: map[types.UID]state.PodMount{"b": {Volume: pv("b"), State: podvol.NotMounted}},
			want: map[types.UID]string{"b": msg("b", "ns/a")}, plan: "volume_mount v pod=ns/a"},
		{name: "none has it: the first by UID", spec: rwop, desired: []podvol.PodVolume{pv("a"), pv("b"), pv("c")},
			want: map[types.UID]string{"b": msg("b", "ns/a"), "c": msg("c", "ns/a")}, plan: "volume_mount v pod=ns/a"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.pods == nil {
				tc.pods = map[types.UID]state.PodMount{}
			}
			v := View{Name: "v", Spec: tc.spec, Desired: tc.desired, Known: true, Caps: attachStage,
				Actual: state.ActualVolume{Attached: true, DeviceState: podvol.Mounted, Pods: tc.pods}}
			for uid, pm := range tc.pods {
				if pm.Busy { // as the loop has it: a publish in flight
					v.InFlight = map[oe.Key]oe.OpKind{{Volume: "v", Pod: uid}: oe.OpPublish}
				}
			}
			got := rwopRefusals(v)
			if len(got) != len(tc.want) {
				t.Fatalf("refusals = %v, want %v", got, tc.want)
			}
			for uid, want := range tc.want {
				if err := got[uid]; err == nil || err.Error() != want || !errors.Is(err, ErrReadWriteOncePod) {
					t.Errorf("refusal of %s = %v\nwant %s", uid, err, want)
				}
			}
			d := Plan(v)
			var acts []string
			for _, a := range d.Actions {
				acts = append(acts, a.String())
			}
			if strings.Join(acts, "; ") != tc.plan {
				t.Errorf("plan = %q, want %q", strings.Join(acts, "; "), tc.plan)
			}
			if len(d.Refused) != len(tc.want) {
				t.Errorf("plan refused %v, want %d", d.Refused, len(tc.want))
			}
		})
	}
}

// TestRWOPStage: a volume whose every desired pod is refused is not
// staged; otherwise the stage is for a pod not refused.
func TestRWOPStage(t *testing.T) {
	pv := func(uid string) podvol.PodVolume {
		return podvol.PodVolume{Pod: podvol.PodRef{UID: types.UID(uid), Namespace: "ns", Name: uid}, SpecName: "data"}
	}
	spec := podvol.VolumeSpec{Name: "v", AccessMode: string(v1.ReadWriteOncePod)}
	d := Plan(View{Name: "v", Spec: spec, Caps: attachStage, Desired: []podvol.PodVolume{pv("b")}, Known: true,
		Actual: state.ActualVolume{Attached: true, DeviceState: podvol.Uncertain, Pods: map[types.UID]state.PodMount{"a": {Volume: pv("a"), State: podvol.Mounted}}}})
	if len(d.Actions) != 1 || d.Actions[0].String() != "volume_unmount v pod=ns/a" {
		t.Errorf("every desired pod refused: plan = %v, want only the owner's unpublish", d.Actions)
	}
	d = Plan(View{Name: "v", Spec: spec, Caps: attachStage, Desired: []podvol.PodVolume{pv("a"), pv("b")}, Known: true,
		Actual: state.ActualVolume{Attached: true, Pods: map[types.UID]state.PodMount{"a": {Volume: pv("a"), State: podvol.Uncertain}}}})
	if len(d.Actions) != 1 || d.Actions[0].Kind != oe.OpStage || d.Actions[0].Pod.Pod.UID != "a" {
		t.Errorf("device not staged, pod a owns it: plan = %v, want a stage for pod a", d.Actions)
	}
	if len(d.Refused) != 1 || d.Refused[0].Pod.Pod.UID != "b" {
		t.Errorf("refused = %v, want pod b", d.Refused)
	}
}
