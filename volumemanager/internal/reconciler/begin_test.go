package reconciler

import (
	"testing"
	"time"

	"github.com/go-logr/logr"
	fakeclock "k8s.io/utils/clock/testing"

	"github.com/nodevol/nodevol/podvol"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
	"github.com/nodevol/nodevol/volumemanager/internal/planner"
	"github.com/nodevol/nodevol/volumemanager/internal/state"
)

// TestBeginWithoutExpansion: an action that expands, given without the
// planner's expansion target, is not started (no nil dereference) and
// leaves nothing in flight; with the target it starts.
func TestBeginWithoutExpansion(t *testing.T) {
	spec := podvol.VolumeSpec{Name: "csi/pv-1", PVName: "pv-1", Driver: "csi", VolumeHandle: "pv-1", Mode: podvol.Filesystem}
	pod := podvol.PodVolume{Pod: podvol.PodRef{UID: "uid-1", Namespace: "ns", Name: "pod"}, SpecName: "v"}
	for _, a := range []oe.Action{
		{Kind: oe.OpExpand, Volume: spec.Name, Pod: pod},
		{Kind: oe.OpPublish, Volume: spec.Name, Pod: pod, Expand: 1 << 30},
	} {
		var started []oe.Action
		l := New(Config{Node: "node-1", Clock: fakeclock.NewFakeClock(time.Unix(0, 0)),
			DSW: state.NewDesiredStateOfWorld(func(podvol.UniqueVolumeName) {}), ASW: state.NewActualStateOfWorld(),
			Host: testHost{onStart: func(a oe.Action, _ Input) { started = append(started, a) }}}, nil, nil)
		l.logger = logr.Discard()
		v := planner.View{Name: spec.Name, Spec: spec, Actual: state.ActualVolume{Spec: spec}}
		l.begin(a, v, nil)
		if len(started) != 0 || l.vols[spec.Name] != nil {
			t.Errorf("%s without an expansion: started %v, memo %+v; want nothing", a.Kind, started, l.vols[spec.Name])
		}
		l.begin(a, v, &planner.Expansion{})
		if len(started) != 1 {
			t.Errorf("%s with an expansion: started %v, want it", a.Kind, started)
		}
	}
}
