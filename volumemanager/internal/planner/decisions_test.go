package planner

import (
	"reflect"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/podvol"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
	"github.com/nodevol/nodevol/volumemanager/internal/state"
)

// TestStagingReferences: the unstage gate reads the references gathered
// in the current resync only; older ones are looked for again by an
// unstage.
func TestStagingReferences(t *testing.T) {
	staged := state.ActualVolume{Attached: true, DeviceState: podvol.Mounted}
	refs := StagingRefs{Paths: []string{"/pods/x/mount"}, Resync: 3}
	for _, tc := range []struct {
		name   string
		resync int
		want   string
	}{
		{name: "gathered in this resync: waits", resync: 3},
		{name: "gathered before the resync: unstage again", resync: 4, want: "unmount_device v"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Plan(View{Name: "v", Known: true, Actual: staged, Refs: refs, Resync: tc.resync})
			if got := actions(d); got != tc.want {
				t.Errorf("plan = %q, want %q (waiting %q)", got, tc.want, d.Waiting)
			}
		})
	}
}

// TestForgetBackoff: after a change of the world every failed key of the
// volume is forgotten and retried at once; without one, the backoff holds.
func TestForgetBackoff(t *testing.T) {
	const vol = podvol.UniqueVolumeName("v")
	p := podvol.PodVolume{Pod: podvol.PodRef{UID: "a", Namespace: "ns", Name: "a"}, SpecName: "data"}
	v := View{Name: vol, Desired: []podvol.PodVolume{p}, Known: true, Actual: state.ActualVolume{Attached: true}, Caps: attachStage,
		Backoff: map[oe.Key]*oe.BackoffEntry{
			{Volume: vol}:           {Kind: oe.OpStage, Failures: 3, Until: time.Unix(10, 0)},
			{Volume: vol, Pod: "a"}: {Kind: oe.OpPublish, Failures: 1, Until: time.Unix(10, 0)},
		},
		Now: time.Unix(5, 0)}
	d := Plan(v)
	if actions(d) != "" || d.ForgetBackoff != nil || d.Retry != time.Unix(10, 0) {
		t.Errorf("no change: plan = %q, forget %v, retry %v; want nothing until 10", actions(d), d.ForgetBackoff, d.Retry)
	}
	v.WorldChanged = true
	d = Plan(v)
	if want := []oe.Key{{Volume: vol}, {Volume: vol, Pod: "a"}}; !reflect.DeepEqual(d.ForgetBackoff, want) {
		t.Errorf("forget %v, want %v", d.ForgetBackoff, want)
	}
	if actions(d) != "mount_device v" || !d.Retry.IsZero() {
		t.Errorf("world changed: plan = %q, retry %v; want the stage at once", actions(d), d.Retry)
	}
}

// TestAdopt: a pod mount found on disk (its pod known by UID only) is
// adopted by the desired pod of that UID, as a planned step, and nothing
// is published again; the view given is not changed.
func TestAdopt(t *testing.T) {
	gid := int64(7)
	p := podvol.PodVolume{Pod: podvol.PodRef{UID: "a", Namespace: "ns", Name: "a"}, SpecName: "data", FSGroup: &gid}
	found := state.PodMount{Volume: podvol.PodVolume{Pod: podvol.PodRef{UID: "a"}}, State: podvol.Mounted}
	pods := map[types.UID]state.PodMount{"a": found}
	v := View{Name: "v", Desired: []podvol.PodVolume{p}, Known: true, Caps: attachStage,
		Actual: state.ActualVolume{Attached: true, DeviceState: podvol.Mounted, Pods: pods}}
	d := Plan(v)
	if len(d.Adopt) != 1 || d.Adopt[0].Pod != p.Pod || d.Adopt[0].FSGroup != &gid {
		t.Errorf("adopt = %v, want pod a's volume", d.Adopt)
	}
	if actions(d) != "" {
		t.Errorf("plan = %q, want nothing (the mount is what the pod wants)", actions(d))
	}
	if pods["a"] != found {
		t.Errorf("the view's pods changed: %v", pods["a"])
	}
	pods["a"] = state.PodMount{Volume: found.Volume, State: podvol.Uncertain}
	if d := Plan(v); len(d.Adopt) != 0 || actions(d) != "volume_mount v pod=ns/a" {
		t.Errorf("uncertain: adopt %v, plan %q; want no adoption, a publish", d.Adopt, actions(d))
	}
}

// TestUnpublishCleansSubPaths: the unpublish of a filesystem volume cleans
// the pod's subPath bind mounts first; a block volume has none.
func TestUnpublishCleansSubPaths(t *testing.T) {
	a := podvol.PodVolume{Pod: podvol.PodRef{UID: "a", Namespace: "ns", Name: "a"}, SpecName: "data"}
	for _, tc := range []struct {
		mode podvol.VolumeMode
		want bool
	}{
		{podvol.Filesystem, true},
		{podvol.Block, false},
	} {
		v := View{Name: "v", Known: true, Actual: state.ActualVolume{Spec: podvol.VolumeSpec{Mode: tc.mode}, DeviceState: podvol.Mounted,
			Pods: map[types.UID]state.PodMount{"a": {Volume: a, State: podvol.Mounted}}}}
		d := Plan(v)
		if len(d.Actions) != 1 || d.Actions[0].Kind != oe.OpUnpublish || d.Actions[0].CleanSubPaths != tc.want {
			t.Errorf("%v: plan = %+v, want one unpublish with CleanSubPaths %v", tc.mode, d.Actions, tc.want)
		}
	}
}

func actions(d Decision) string {
	var out string
	for i, a := range d.Actions {
		if i > 0 {
			out += "; "
		}
		out += a.String()
	}
	return out
}
