package volumemanager

import (
	"context"
	"testing"
	"time"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/volume"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/mount-utils"
)

// TestVolumeHealth: for a driver with VOLUME_CONDITION, GetVolumeStats
// returns the volume's condition, kubelet_volume_stats_health_status_abnormal
// reports it by claim (0 or 1), and the pod gets one VolumeConditionAbnormal
// event each time the volume turns abnormal, however often stats are asked.
func TestVolumeHealth(t *testing.T) {
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true, GetVolumeStats: true, VolumeCondition: true})
	pvc, pv := csitest.BoundClaim("ns", "a", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-a"})
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{}), pvc, pv)
	reg := prometheus.NewRegistry()
	events := record.NewFakeRecorder(10)
	vm, stop := startVMWith(t, Config{NodeName: node, KubeClient: client, RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil),
		Registerer: reg, EventRecorder: events, VolumeStatsPeriod: time.Nanosecond}, drv)
	defer stop()
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "a"}}})
	vm.AddPod(pod)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	const gauge = "kubelet_volume_stats_health_status_abnormal"
	check := func(step string, want volume.Condition, wantGauge, wantEvent string) {
		t.Helper()
		for i := 0; i < 2; i++ { // asked twice: an event at most once
			stats, err := vm.GetVolumeStats(ctx, pod.UID)
			if err != nil {
				t.Fatal(err)
			}
			if c := stats["data"].Condition; c == nil || *c != want {
				t.Errorf("%s: condition %+v, want %+v", step, c, want)
			}
			if got := samples(t, reg, gauge); got != wantGauge {
				t.Errorf("%s: %s\nwant %s", step, got, wantGauge)
			}
		}
		var got []string
		for len(events.Events) > 0 {
			got = append(got, <-events.Events)
		}
		if (wantEvent == "" && len(got) != 0) || (wantEvent != "" && (len(got) != 1 || got[0] != wantEvent)) {
			t.Errorf("%s: events %q, want %q", step, got, wantEvent)
		}
	}
	healthy := gauge + `{namespace="ns",persistentvolumeclaim="a"} 0`
	sick := gauge + `{namespace="ns",persistentvolumeclaim="a"} 1`
	check("healthy", volume.Condition{}, healthy, "")
	drv.SetVolumeCondition("handle-a", csitest.VolumeCondition{Abnormal: true, Message: "disk failing"})
	check("turned abnormal", volume.Condition{Abnormal: true, Message: "disk failing"}, sick,
		"Warning VolumeConditionAbnormal Volume data: disk failing")
	drv.SetVolumeCondition("handle-a", csitest.VolumeCondition{Message: "repaired"})
	check("healthy again", volume.Condition{Message: "repaired"}, healthy, "")
	drv.SetVolumeCondition("handle-a", csitest.VolumeCondition{Abnormal: true, Message: "disk failing again"})
	check("abnormal again", volume.Condition{Abnormal: true, Message: "disk failing again"}, sick,
		"Warning VolumeConditionAbnormal Volume data: disk failing again")
}
