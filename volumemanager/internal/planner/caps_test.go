package planner

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
	"github.com/nodevol/nodevol/volumemanager/internal/state"
)

// TestCapabilities: each step the plan starts for a wanted volume reads
// the plugin's Capabilities: attach, stage, republish, ownership and the
// lifecycle modes; unknown capabilities make the volume wait.
func TestCapabilities(t *testing.T) {
	const vol = podvol.UniqueVolumeName("v")
	gid := int64(7)
	pv := func(uid string) podvol.PodVolume {
		return podvol.PodVolume{Pod: podvol.PodRef{UID: types.UID(uid), Namespace: "ns", Name: uid}, SpecName: "data", FSGroup: &gid}
	}
	readOnly := pv("a")
	readOnly.ReadOnly = true
	noGroup := pv("a")
	noGroup.FSGroup = nil
	mounted := map[types.UID]state.PodMount{"a": {Volume: pv("a"), State: podvol.Mounted}}
	persistent := []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent}
	ephemeral := []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecycleEphemeral}
	stageOnly := volume.Capabilities{Stages: true}
	own := volume.Capabilities{OwnershipChange: true}
	tests := []struct {
		name    string
		caps    volume.Capabilities
		capsErr error
		spec    podvol.VolumeSpec
		desired []podvol.PodVolume
		actual  state.ActualVolume
		view    View
		want    string // actions, each with its ownership decision
		refused string // the refusals' errors
		wait    string // a Waiting line that must be there
	}{
		{name: "attachable: the attachment is confirmed first", caps: attachStage, desired: []podvol.PodVolume{pv("a")},
			want: "verify_controller_attached_volume v"},
		{name: "not attachable: no confirmation, staged at once", caps: stageOnly, desired: []podvol.PodVolume{pv("a")},
			want: "mount_device v"},
		{name: "not attachable: not held until reported in use", caps: stageOnly, desired: []podvol.PodVolume{pv("a")},
			view: View{AttachHeld: true}, want: "mount_device v"},
		{name: "not attachable: no VolumeAttachment of its own", caps: stageOnly, desired: []podvol.PodVolume{pv("a")},
			view: View{SelfAttach: true}, want: "mount_device v"},
		{name: "attachable, self-attach", caps: attachStage, desired: []podvol.PodVolume{pv("a")},
			view: View{SelfAttach: true}, want: "volume_attach v"},
		{name: "not staged: published once attached", caps: volume.Capabilities{Attachable: true}, desired: []podvol.PodVolume{pv("a")},
			actual: state.ActualVolume{Attached: true}, want: "volume_mount v pod=ns/a own=false"},
		{name: "neither attached nor staged: published at once", desired: []podvol.PodVolume{pv("a")},
			want: "volume_mount v pod=ns/a own=false"},
		{name: "republish: a mounted pod due is published again", caps: volume.Capabilities{Republish: true}, desired: []podvol.PodVolume{pv("a")},
			actual: state.ActualVolume{Pods: mounted}, view: View{Republish: map[types.UID]bool{"a": true}}, want: "volume_mount v pod=ns/a own=false"},
		{name: "no republish: a mounted pod stays", desired: []podvol.PodVolume{pv("a")},
			actual: state.ActualVolume{Pods: mounted}, view: View{Republish: map[types.UID]bool{"a": true}}},
		{name: "ownership: a writable pod with an fsGroup", caps: own, desired: []podvol.PodVolume{pv("a")},
			want: "volume_mount v pod=ns/a own=true"},
		{name: "ownership: not for a read-only use", caps: own, desired: []podvol.PodVolume{readOnly},
			want: "volume_mount v pod=ns/a own=false"},
		{name: "ownership: not without an fsGroup", caps: own, desired: []podvol.PodVolume{noGroup},
			want: "volume_mount v pod=ns/a own=false"},
		{name: "ownership: not when the plugin does not change it", desired: []podvol.PodVolume{pv("a")},
			want: "volume_mount v pod=ns/a own=false"},
		{name: "ownership: the publish that expands carries it", caps: own, desired: []podvol.PodVolume{pv("a")}, spec: podvol.VolumeSpec{PVName: "pv"},
			actual: state.ActualVolume{Pods: map[types.UID]state.PodMount{}}, view: View{Expansion: grownTo(1 << 30)}, want: fmt.Sprintf("volume_mount v pod=ns/a expand=%d own=true", 1<<30)},
		{name: "lifecycle: an inline volume of a Persistent-only driver is refused", caps: volume.Capabilities{LifecycleModes: persistent},
			spec: podvol.VolumeSpec{Driver: "drv", Ephemeral: true}, desired: []podvol.PodVolume{pv("a")},
			refused: "pod ns/a cannot use volume v: CSI driver drv does not support volume lifecycle mode Ephemeral (CSIDriver volumeLifecycleModes: [Persistent])"},
		{name: "lifecycle: an inline volume of a driver listing Ephemeral", caps: volume.Capabilities{LifecycleModes: append(ephemeral, persistent...)},
			spec: podvol.VolumeSpec{Driver: "drv", Ephemeral: true}, desired: []podvol.PodVolume{pv("a")}, want: "volume_mount v pod=ns/a own=false"},
		{name: "lifecycle: a PV of an Ephemeral-only driver: refused, not even attached", caps: volume.Capabilities{Attachable: true, Stages: true, LifecycleModes: ephemeral},
			spec: podvol.VolumeSpec{Driver: "drv", PVName: "pv-1"}, desired: []podvol.PodVolume{pv("a")},
			refused: "pod ns/a cannot use volume pv-1: CSI driver drv does not support volume lifecycle mode Persistent (CSIDriver volumeLifecycleModes: [Ephemeral])"},
		{name: "unknown: the volume waits, nothing starts", capsErr: errors.New("driver drv not registered"), desired: []podvol.PodVolume{pv("a")},
			wait: "driver drv not registered"},
		{name: "unknown: an unwanted pod is still unpublished", capsErr: errors.New("driver drv not registered"), desired: []podvol.PodVolume{pv("a")},
			actual: state.ActualVolume{Pods: map[types.UID]state.PodMount{"b": {Volume: pv("b"), State: podvol.Mounted}}},
			want:   "volume_unmount v pod=ns/b", wait: "driver drv not registered"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := tc.view
			tc.spec.Name = vol
			v.Name, v.Spec, v.Desired, v.Actual, v.Caps, v.CapsErr = vol, tc.spec, tc.desired, tc.actual, tc.caps, tc.capsErr
			v.Known = tc.actual.Attached || tc.actual.Pods != nil
			d := Plan(v)
			var got, refused []string
			for _, a := range d.Actions {
				if a.Kind == oe.OpPublish {
					got = append(got, fmt.Sprintf("%s own=%v", a, a.ChangeOwnership))
				} else {
					got = append(got, a.String())
				}
			}
			for _, r := range d.Refused {
				refused = append(refused, r.Err.Error())
			}
			if g := strings.Join(got, "; "); g != tc.want {
				t.Errorf("plan = %q, want %q", g, tc.want)
			}
			if r := strings.Join(refused, "; "); r != tc.refused {
				t.Errorf("refused = %q, want %q", r, tc.refused)
			}
			if tc.wait != "" && (!strings.Contains(strings.Join(d.Waiting, "\n"), tc.wait) || d.NotReady == nil) {
				t.Errorf("waiting = %q, not ready = %v; want %q", d.Waiting, d.NotReady, tc.wait)
			}
			if tc.wait == "" && d.NotReady != nil {
				t.Errorf("not ready = %v, want nil", d.NotReady)
			}
		})
	}
}

// TestPublishRepublish: a publish is a republish (the plugin leaves what
// is there when it fails) when the pod may be using the volume already:
// Mounted and due again, or Uncertain as found on disk at start; never
// for a first publish or an Uncertain one an operation left.
func TestPublishRepublish(t *testing.T) {
	const vol = podvol.UniqueVolumeName("v")
	p := podvol.PodVolume{Pod: podvol.PodRef{UID: "a", Namespace: "ns", Name: "a"}, SpecName: "data"}
	for _, tc := range []struct {
		name string
		pods map[types.UID]state.PodMount
		want bool
	}{
		{name: "first publish"},
		{name: "Mounted, due again", pods: map[types.UID]state.PodMount{"a": {Volume: p, State: podvol.Mounted}}, want: true},
		{name: "Uncertain after an operation", pods: map[types.UID]state.PodMount{"a": {Volume: p, State: podvol.Uncertain}}},
		{name: "Uncertain as found on disk", pods: map[types.UID]state.PodMount{"a": {Volume: p, State: podvol.Uncertain, Found: true}}, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := View{Name: vol, Spec: podvol.VolumeSpec{Name: vol}, Desired: []podvol.PodVolume{p}, Caps: volume.Capabilities{Republish: true},
				Actual: state.ActualVolume{Pods: tc.pods}, Known: tc.pods != nil, Republish: map[types.UID]bool{"a": true}}
			d := Plan(v)
			if len(d.Actions) != 1 || d.Actions[0].Kind != oe.OpPublish {
				t.Fatalf("plan = %v, want one publish", d.Actions)
			}
			if got := d.Actions[0].Republish; got != tc.want {
				t.Errorf("Republish = %v, want %v", got, tc.want)
			}
		})
	}
}
