package planner

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/cache"
	"github.com/nodevol/nodevol/volume"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
	"github.com/nodevol/nodevol/volumemanager/internal/state"
)

// attachStage are the capabilities of a CSI PV whose driver stages.
var attachStage = volume.Capabilities{Attachable: true, Stages: true, Block: true}

func TestPlan(t *testing.T) {
	const vol = cache.UniqueVolumeName("v")
	pv := func(uid string) cache.PodVolume {
		return cache.PodVolume{Pod: cache.PodRef{UID: types.UID(uid), Namespace: "ns", Name: uid}, SpecName: "data"}
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
	staged := state.ActualVolume{Attached: true, DeviceState: cache.Mounted}
	tests := []struct {
		name     string
		desired  []cache.PodVolume
		spec     cache.VolumeSpec
		actual   state.ActualVolume
		known    bool
		view     View // the other inputs
		want     string
		wantDone bool
	}{
		{name: "new volume: confirm attach", desired: []cache.PodVolume{pv("a")}, want: "verify_controller_attached_volume v"},
		{name: "attached: stage", desired: []cache.PodVolume{pv("a")}, known: true, actual: state.ActualVolume{Attached: true}, want: "mount_device v"},
		{name: "uncertain device: stage again", desired: []cache.PodVolume{pv("a")}, known: true, actual: state.ActualVolume{Attached: true, DeviceState: cache.Uncertain}, want: "mount_device v"},
		{name: "staged: publish every pod lacking it", desired: []cache.PodVolume{pv("a"), pv("b"), pv("c")}, known: true,
			actual: state.ActualVolume{Attached: true, DeviceState: cache.Mounted, Pods: mounts("b=Mounted", "c=Uncertain")},
			want:   "volume_mount v pod=ns/a; volume_mount v pod=ns/c"},
		{name: "all published: nothing", desired: []cache.PodVolume{pv("a")}, known: true, actual: state.ActualVolume{Attached: true, DeviceState: cache.Mounted, Pods: mounts("a=Mounted")}},
		{name: "pod moved: unpublish before publish", desired: []cache.PodVolume{pv("b")}, known: true,
			actual: state.ActualVolume{Attached: true, DeviceState: cache.Mounted, Pods: mounts("a=Mounted")},
			want:   "volume_unmount v pod=ns/a; volume_mount v pod=ns/b"},
		{name: "unwanted: unpublish all, uncertain too", known: true,
			actual: state.ActualVolume{Attached: true, DeviceState: cache.Mounted, Pods: mounts("a=Mounted", "b=Uncertain", "c=NotMounted")},
			want:   "volume_unmount v pod=ns/a; volume_unmount v pod=ns/b"},
		{name: "unwanted and unpublished: unstage", known: true, actual: staged, want: "unmount_device v"},
		{name: "unwanted, device uncertain: unstage", known: true, actual: state.ActualVolume{Attached: true, DeviceState: cache.Uncertain}, want: "unmount_device v"},
		{name: "unwanted and unstaged: done", known: true, actual: state.ActualVolume{Attached: true}, wantDone: true},
		{name: "unknown and unwanted: done", wantDone: true},
		{name: "held pod: not unpublished, device kept", known: true,
			actual: state.ActualVolume{Attached: true, DeviceState: cache.Mounted, Pods: mounts("a=Uncertain")},
			view:   View{Pods: map[types.UID]PodFacts{"a": {Found: true}}}},
		{name: "held device: not unstaged", known: true, actual: staged, view: View{FoundDevice: true}},
		{name: "referenced device: not unstaged", known: true, actual: staged, view: View{Refs: StagingRefs{Paths: []string{"/pods/x/mount"}}}},
		{name: "publish in flight counts as published: no unstage", known: true, actual: staged,
			view: View{InFlight: map[oe.Key]oe.OpKind{{Volume: vol, Pod: "a"}: oe.OpPublish}}},
		{name: "stage in flight: nothing else", desired: []cache.PodVolume{pv("a")}, known: true, actual: state.ActualVolume{Attached: true},
			view: View{InFlight: map[oe.Key]oe.OpKind{{Volume: vol}: oe.OpStage}}},
		{name: "other pod's publish in flight: publish beside it", desired: []cache.PodVolume{pv("a"), pv("b")}, known: true, actual: staged,
			view: View{InFlight: map[oe.Key]oe.OpKind{{Volume: vol, Pod: "a"}: oe.OpPublish}}, want: "volume_mount v pod=ns/b"},
		{name: "unpublish planned: no stage beside it", desired: []cache.PodVolume{pv("b")}, known: true,
			actual: state.ActualVolume{Attached: true, DeviceState: cache.Uncertain, Pods: mounts("a=Mounted")},
			want:   "volume_unmount v pod=ns/a"},
		{name: "stage backing off: waits", desired: []cache.PodVolume{pv("a")}, known: true, actual: state.ActualVolume{Attached: true},
			view: View{Backoff: map[oe.Key]*oe.BackoffEntry{{Volume: vol}: {Kind: oe.OpStage, Until: time.Unix(10, 0)}}, Now: time.Unix(5, 0)}},
		{name: "attach held until reported in use", desired: []cache.PodVolume{pv("a")}, view: View{AttachHeld: true}},
		{name: "republish a mounted pod", desired: []cache.PodVolume{pv("a")}, known: true, actual: state.ActualVolume{Attached: true, DeviceState: cache.Mounted, Pods: mounts("a=Mounted")},
			view: View{Republish: map[types.UID]bool{"a": true}, Caps: volume.Capabilities{Attachable: true, Stages: true, Republish: true}}, want: "volume_mount v pod=ns/a"},
		{name: "expansion once mounted", desired: []cache.PodVolume{pv("a")}, known: true, actual: state.ActualVolume{Attached: true, DeviceState: cache.Mounted, Pods: mounts("a=Mounted")},
			view: View{Expansion: grownTo(1 << 30)}, want: "volume_fs_resize v"},
		{name: "ephemeral: no attach, no stage", desired: []cache.PodVolume{pv("a")}, spec: cache.VolumeSpec{Ephemeral: true},
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
	pv := func(uid string) cache.PodVolume {
		return cache.PodVolume{Pod: cache.PodRef{UID: types.UID(uid), Namespace: "ns", Name: uid}, SpecName: "data", FSGroup: &gid}
	}
	tests := []struct {
		name    string
		desired []cache.PodVolume
		pods    map[types.UID]state.PodMount
		want    types.UID
	}{
		{name: "first pod", desired: []cache.PodVolume{pv("a"), pv("b")}, want: "a"},
		{name: "first pod not yet mounted (device uncertain after a restart)", desired: []cache.PodVolume{pv("a"), pv("b")},
			pods: map[types.UID]state.PodMount{"a": {Volume: pv("a"), State: cache.Mounted}}, want: "b"},
		{name: "all mounted: the first", desired: []cache.PodVolume{pv("a"), pv("b")},
			pods: map[types.UID]state.PodMount{"a": {Volume: pv("a"), State: cache.Mounted}, "b": {Volume: pv("b"), State: cache.Mounted}}, want: "a"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := Plan(View{Name: "v", Desired: tc.desired, Known: true, Caps: attachStage,
				Actual: state.ActualVolume{Attached: true, DeviceState: cache.Uncertain, Pods: tc.pods}})
			if len(d.Actions) != 1 || d.Actions[0].Kind != oe.OpStage {
				t.Fatalf("plan = %v, want one stage", d.Actions)
			}
			if got := d.Actions[0].Pod; got.Pod.UID != tc.want || got.FSGroup != &gid {
				t.Errorf("stage for pod %q (fsGroup %v), want %q with its fsGroup", got.Pod.UID, got.FSGroup, tc.want)
			}
		})
	}
}
