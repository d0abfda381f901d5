package volumemanager

import (
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// TestStageGetsPodFSGroup: through the whole manager, a driver with
// VOLUME_MOUNT_GROUP gets the fsGroup of the pod whose mount stages the
// volume in NodeStageVolume, and each pod's own in NodePublishVolume.
func TestStageGetsPodFSGroup(t *testing.T) {
	e := newEnv(t, envOptions{driver: csitest.Options{VolumeMountGroup: true}})
	e.claimWith("data", csitest.PVSpec{AccessModes: []v1.PersistentVolumeAccessMode{"ReadWriteMany"}})
	p1 := csitest.Pod("ns", "p1", csitest.PodSpec{FSGroup: ptr.To[int64](1001), Volumes: []csitest.PodVolume{
		{Name: "data", Claim: "data"},
	}})
	p2 := csitest.Pod("ns", "p2", csitest.PodSpec{FSGroup: ptr.To[int64](1002), Volumes: []csitest.PodVolume{
		{Name: "data", Claim: "data"},
	}})
	for _, p := range []*v1.Pod{p1, p2} {
		if err := e.mount(p, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	var stages, publishes []string
	for _, r := range e.drv.Requests() {
		switch req := r.Req.(type) {
		case *csi.NodeStageVolumeRequest:
			stages = append(stages, req.GetVolumeCapability().GetMount().GetVolumeMountGroup())
		case *csi.NodePublishVolumeRequest:
			publishes = append(publishes, req.GetVolumeCapability().GetMount().GetVolumeMountGroup())
		}
	}
	if len(stages) != 1 || stages[0] != "1001" {
		t.Errorf("NodeStageVolume volume_mount_group = %q, want [1001] (the pod being mounted)", stages)
	}
	if len(publishes) != 2 || publishes[0] != "1001" || publishes[1] != "1002" {
		t.Errorf("NodePublishVolume volume_mount_group = %q, want [1001 1002]", publishes)
	}
}
