package reconciler

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	fakeclock "k8s.io/utils/clock/testing"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volumemanager/internal/state"
)

// republishPlugin republishes its volumes, at resyncs only if atResync.
type republishPlugin struct {
	name     string
	atResync bool
}

func (p republishPlugin) Name() string                                        { return p.name }
func (p republishPlugin) CanSupport(*v1.Volume) bool                          { return false }
func (p republishPlugin) TearDown(context.Context, volume.MountRequest) error { return nil }
func (p republishPlugin) SetUp(context.Context, volume.MountRequest) (string, error) {
	return "", nil
}
func (p republishPlugin) Capabilities(*podvol.VolumeSpec) (volume.Capabilities, error) {
	return volume.Capabilities{Republish: true, RepublishAtResyncOnly: p.atResync}, nil
}

// TestPodContentRepublishes: a change of what a pod reads through the
// node (an object it holds, a pod certificate) publishes again its Mounted
// volumes whose plugin republishes, except those it refreshes at resyncs
// only (Capabilities.RepublishAtResyncOnly: a CSI driver's), whatever the
// plugin's name.
func TestPodContentRepublishes(t *testing.T) {
	follows, resyncOnly := republishPlugin{name: "example.com/follows"}, republishPlugin{name: "example.com/resync", atResync: true}
	plugins, err := volume.NewRegistry(follows, resyncOnly)
	if err != nil {
		t.Fatal(err)
	}
	l := New(Config{Node: "node-1", Clock: fakeclock.NewFakeClock(time.Unix(0, 0)), Volumes: plugins, Host: testHost{},
		DSW: state.NewDesiredStateOfWorld(func(podvol.UniqueVolumeName) {}), ASW: state.NewActualStateOfWorld()}, nil, nil)
	pod := podvol.PodRef{UID: "uid-1", Namespace: "ns", Name: "p"}
	var resolved []state.DesiredVolume
	for _, p := range []republishPlugin{follows, resyncOnly} {
		spec := podvol.VolumeSpec{Name: podvol.UniqueVolumeName(p.name + "/uid-1-v"), Plugin: p.name, Mode: podvol.Filesystem}
		vol := podvol.PodVolume{Pod: pod, SpecName: p.name}
		resolved = append(resolved, state.DesiredVolume{Spec: spec, Volume: vol})
		l.ASW.SetPodMount(spec, vol, podvol.Mounted, "/p/"+p.name)
	}
	l.DSW.SetPod(pod, []string{follows.name, resyncOnly.name}, resolved, nil)
	l.podCredentialsChanged(map[types.UID]struct{}{pod.UID: {}})
	for _, dv := range resolved {
		want := dv.Spec.Plugin == follows.name
		if got := l.vols[dv.Spec.Name] != nil && l.vols[dv.Spec.Name].republish[pod.UID]; got != want {
			t.Errorf("%s marked for republishing: %v, want %v", dv.Spec.Name, got, want)
		}
	}
}
