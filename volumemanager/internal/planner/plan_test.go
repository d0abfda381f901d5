package planner

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
	"github.com/nodevol/nodevol/volumemanager/internal/state"
)

// attachStage are the capabilities of a CSI PV whose driver stages.
var attachStage = volume.Capabilities{Attachable: true, Stages: true, Block: true}

func TestPlan(t *testing.T) {
	const vol = podvol.UniqueVolumeName("v")
	pv := func(uid string) podvol.PodVolume {
		return podvol.PodVolume{Pod: podvol.PodRef{UID: types.UID(uid), Namespace: "ns", Name: uid}, SpecName: "data"}
	}
	mounts := func(states ...string) map[types.UID]state.PodMount {
		out := map[types.UID]state.PodMount{}
		for _, s := range states { // "uid=State"
			uid, st, _ := strings.Cut(s, "=")
			m := state.PodMount{Volume: pv(uid)}
			fmt.Sscan(map[string]string{"Mounted": "2", "Uncertain": "1", "NotMounted": "0"}[st], (*int)(&m.State))
			out[types.UID(uid)] = m
		}
		return out
	}
	staged := state.ActualVolume{Attached: true, DeviceState: podvol.Mounted}
	tests := []struct {
		name     string
		desired  []podvol.PodVolume
		spec     podvol.VolumeSpec
		actual   state.ActualVolume
		known    bool
		view     View // the other inputs
		want     string
		wantDone bool
	}{
		{name: "new volume: confirm attach", desired: []podvol.PodVolume{pv("a")}, want: "verify_controller_attached_volume v"},
		{name: "attached: stage", desired: []podvol.PodVolume{pv("a")}, known: true, actual: state.ActualVolume{Attached: true}, want: "mount_device v"},
		{name: "uncertain device: stage again", desired: []podvol.PodVolume{pv("a")}, known: true, actual: state.ActualVolume{Attached: true, DeviceState: podvol.Uncertain}, want: "mount_device v"},
		{name: "staged: publish every pod lacking it", desired: []podvol.PodVolume{pv("a"), pv("b"), pv("c")}, known: true,
			actual: state.ActualVolume{Attached: true, DeviceState: podvol.Mounted, Pods: mounts("b=Mounted", "c=Uncertain")},
			want:   "volume_mount v pod=ns/a; volume_mount v pod=ns/c"},
		{name: "all published: nothing", desired: []podvol.PodVolume{pv("a")}, known: true, actual: state.ActualVolume{Attached: true, DeviceState: podvol.Mounted, Pods: mounts("a=Mounted")}},
		{name: "pod moved: unpublish before publish", desired: []podvol.PodVolume{pv("b")}, known: true,
			actual: state.ActualVolume{Attached: true, DeviceState: podvol.Mounted, Pods: mounts("a=Mounted")},
			want:   "volume_unmount v pod=ns/a; volume_mount v pod=ns/b"},
		{name: "unwanted: unpublish all, uncertain too", known: true,
			actual: state.ActualVolume{Attached: true, DeviceState: podvol.Mounted, Pods: mounts("a=Mounted", "b=Uncertain", "c=NotMounted")},
			want:   "volume_unmount v pod=ns/a; volume_unmount v pod=ns/b"},
		{name: "unwanted and unpublished: unstage", known: true, actual: staged, want: "unmount_device v"},
		{name: "unwanted, device uncertain: unstage", known: true, actual: state.ActualVolume{Attached: true, DeviceState: podvol.Uncertain}, want: "unmount_device v"},
		{name: "unwanted and unstaged: done", known: true, actual: state.ActualVolume{Attached: true}, wantDone: true},
		{name: "unknown and unwanted: done", wantDone: true},
		{name: "held pod: not unpublished, device kept", known: true,
			actual: state.ActualVolume{Attached: true, DeviceState: podvol.Mounted, Pods: mounts("a=Uncertain")},
			view:   View{Pods: map[types.UID]PodFacts{"a": {Found: true}}}},
		{name: "held device: not unstaged", known: true, actual: staged, view: View{FoundDevice: true}},
		{name: "referenced device: not unstaged", known: true, actual: staged, view: View{Refs: StagingRefs{Paths: []string{"/pods/x/mount"}}}},
		{name: "publish in flight counts as published: no unstage", known: true, actual: staged,
			view: View{InFlight: map[oe.Key]oe.OpKind{{Volume: vol, Pod: "a"}: oe.OpPublish}}},
		{name: "stage in flight: nothing else", desired: []podvol.PodVolume{pv("a")}, known: true, actual: state.ActualVolume{Attached: true},
			view: View{InFlight: map[oe.Key]oe.OpKind{{Volume: vol}: oe.OpStage}}},
		{name: "other pod's publish in flight: publish beside it", desired: []podvol.PodVolume{pv("a"), pv("b")}, known: true, actual: staged,
			view: View{InFlight: map[oe.Key]oe.OpKind{{Volume: vol, Pod: "a"}: oe.OpPublish}}, want: "volume_mount v pod=ns/b"},
		{name: "unpublish planned: no stage beside it", desired: []podvol.PodVolume{pv("b")}, known: true,
			actual: state.ActualVolume{Attached: true, DeviceState: podvol.Uncertain, Pods: mounts("a=Mounted")},
			want:   "volume_unmount v pod=ns/a"},
		{name: "stage backing off: waits", desired: []podvol.PodVolume{pv("a")}, known: true, actual: state.ActualVolume{Attached: true},
			view: View{Backoff: map[oe.Key]*oe.BackoffEntry{{Volume: vol}: {Kind: oe.OpStage, Until: time.Unix(10, 0)}}, Now: time.Unix(5, 0)}},
		{name: "attach held until reported in use", desired: []podvol.PodVolume{pv("a")}, view: View{AttachHeld: true}},
		{name: "republish a mounted pod", desired: []podvol.PodVolume{pv("a")}, known: true, actual: state.ActualVolume{Attached: true, DeviceState: podvol.Mounted, Pods: mounts("a=Mounted")},
			view: View{Republish: map[types.UID]bool{"a": true}, Caps: volume.Capabilities{Attachable: true, Stages: true, Republish: true}}, want: "volume_mount v pod=ns/a"},
		{name: "expansion once mounted", desired: []podvol.PodVolume{pv("a")}, known: true, actual: state.ActualVolume{Attached: true, DeviceState: podvol.Mounted, Pods: mounts("a=Mounted")},
			view: View{Expansion: grownTo(1 << 30)}, want: "volume_fs_resize v"},
		{name: "ephemeral: no attach, no stage", desired: []podvol.PodVolume{pv("a")}, spec: podvol.VolumeSpec{Ephemeral: true},
			view: View{Caps: volume.Capabilities{Block: true}}, want: "volume_mount v pod=ns/a"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.actual.Pods == nil {
				tc.actual.Pods = map[types.UID]state.PodMount{}
			}
			v := tc.view
			v.Name, v.Desired, v.Spec, v.Actual, v.Known = vol, tc.desired, tc.spec, tc.actual, tc.known
			if reflect.DeepEqual(v.Caps, volume.Capabilities{}) {
				v.Caps = attachStage
			}
			d := Plan(v)
			done := d.Done
			var got []string
			for _, a := range d.Actions {
				got = append(got, a.String())
			}
			if strings.Join(got, "; ") != tc.want || done != tc.wantDone {
				t.Fatalf("plan = %q done=%v, want %q done=%v", strings.Join(got, "; "), done, tc.want, tc.wantDone)
			}
		})
	}
}

// TestStagePod: a stage carries the pod being mounted (the first desired
// pod by UID without a Mounted publish): its fsGroup goes to a driver that
// applies it at stage.
func TestStagePod(t *testing.T) {
	gid := int64(7)
	pv := func(uid string) podvol.PodVolume {
		return podvol.PodVolume{Pod: podvol.PodRef{UID: types.UID(uid), Namespace: "ns", Name: uid}, SpecName: "data", FSGroup: &gid}
	}
	tests := []struct {
		name    string
		desired []podvol.PodVolume
		pods    map[types.UID]state.PodMount
		want    types.UID
	}{
		{name: "first pod", desired: []podvol.PodVolume{pv("a"), pv("b")}, want: "a"},
		{name: "first pod not yet mounted (device uncertain after a restart)", desired: []podvol.PodVolume{pv("a"), pv("b")},
			pods: map[types.UID]state.PodMount{"a": {Volume: pv("a"), State: podvol.Mounted}}, want: "b"},
		{name: "all mounted: the first", desired: []podvol.PodVolume{pv("a"), pv("b")},
			pods: map[types.UID]state.PodMount{"a": {Volume: pv("a"), State: podvol.Mounted}, "b": {Volume: pv("b"), State: podvol.Mounted}}, want: "a"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := Plan(View{Name: "v", Desired: tc.desired, Known: true, Caps: attachStage,
				Actual: state.ActualVolume{Attached: true, DeviceState: podvol.Uncertain, Pods: tc.pods}})
			if len(d.Actions) != 1 || d.Actions[0].Kind != oe.OpStage {
				t.Fatalf("plan = %v, want one stage", d.Actions)
			}
			if got := d.Actions[0].Pod; got.Pod.UID != tc.want || got.FSGroup != &gid {
				t.Errorf("stage for pod %q (fsGroup %v), want %q with its fsGroup", got.Pod.UID, got.FSGroup, tc.want)
			}
		})
	}
}
