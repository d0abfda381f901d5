package planner

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volumemanager/internal/state"
)

// TestHolds: what keeps a mount or a device no pod wants from being torn
// down, decided from the loop's facts: a pod added but not resolved holds
// its mount; a mount or a device found on disk at start is held until the
// pods are synced (a mount only while its pod was never added); an
// unreadable pod volume directory of the PV holds the device.
func TestHolds(t *testing.T) {
	a := podvol.PodVolume{Pod: podvol.PodRef{UID: "a", Namespace: "ns", Name: "a"}, SpecName: "data"}
	mounted := map[types.UID]state.PodMount{"a": {Volume: a, State: podvol.Mounted}}
	staged := state.ActualVolume{Attached: true, DeviceState: podvol.Mounted}
	detached := state.ActualVolume{Attached: true, SelfAttached: true}
	for _, tc := range []struct {
		name   string
		actual state.ActualVolume
		view   View
		want   string // the actions
		wait   string // in Waiting, when not empty
	}{
		{name: "unresolved pod: its mount held", actual: state.ActualVolume{DeviceState: podvol.Mounted, Pods: mounted},
			view: View{PodsSynced: true, Pods: map[types.UID]PodFacts{"a": {Unresolved: "pod ns/a cannot be resolved yet", Added: true}}},
			wait: "unpublish from pod a held: pod ns/a cannot be resolved yet"},
		{name: "found mount, pods not synced: held", actual: state.ActualVolume{DeviceState: podvol.Mounted, Pods: mounted},
			view: View{Pods: map[types.UID]PodFacts{"a": {Found: true}}}, wait: "unpublish from pod a held: " + foundHeld},
		{name: "found mount, pods synced: unpublished", actual: state.ActualVolume{DeviceState: podvol.Mounted, Pods: mounted},
			view: View{PodsSynced: true, Pods: map[types.UID]PodFacts{"a": {Found: true}}}, want: "volume_unmount v pod=ns/a"},
		{name: "found mount of a pod added (and deleted): unpublished", actual: state.ActualVolume{DeviceState: podvol.Mounted, Pods: mounted},
			view: View{Pods: map[types.UID]PodFacts{"a": {Found: true, Added: true}}}, want: "volume_unmount v pod=ns/a"},
		{name: "no facts: unpublished", actual: state.ActualVolume{DeviceState: podvol.Mounted, Pods: mounted},
			want: "volume_unmount v pod=ns/a"},
		{name: "found device, pods not synced: held", actual: staged, view: View{FoundDevice: true}, wait: "unstage held: " + foundHeld},
		{name: "found device, pods synced: unstaged", actual: staged, view: View{FoundDevice: true, PodsSynced: true}, want: "unmount_device v"},
		{name: "unreadable directory: device held", actual: staged, view: View{PodsSynced: true, Unreadable: "/pods/x/volumes/csi/pv-1"},
			wait: "unstage held: pod volume directory /pods/x/volumes/csi/pv-1 could not be read and may use it"},
		{name: "found attachment, pods not synced: detach held", actual: detached, view: View{FoundDevice: true}, wait: "detach held: " + foundHeld},
		{name: "found attachment, pods synced: detached", actual: detached, view: View{FoundDevice: true, PodsSynced: true}, want: "volume_detach v"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := tc.view
			v.Name, v.Known, v.Actual = "v", true, tc.actual
			d := Plan(v)
			if got := actions(d); got != tc.want {
				t.Errorf("plan = %q, want %q (waiting %q)", got, tc.want, d.Waiting)
			}
			if got := strings.Join(d.Waiting, "; "); tc.wait != "" && got != tc.wait {
				t.Errorf("waiting = %q, want %q", got, tc.wait)
			}
		})
	}
}
