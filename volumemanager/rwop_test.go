package volumemanager

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/volumemanager/internal/reconciler"
)

// TestReadWriteOncePodConflict: through the whole manager, a second pod
// using the ReadWriteOncePod claim of a running pod is refused with an
// error naming both pods, the claim and the volume (WaitForAttachAndMount's
// WaitError) and one FailedMount event; the first pod is untouched (no
// call for it); once the first pod is deleted, the second one mounts.
func TestReadWriteOncePodConflict(t *testing.T) {
	e := newEnv(t, envOptions{driver: csitest.Options{SingleNodeMultiWriter: true}})
	pvName := e.claimWith("db", csitest.PVSpec{AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOncePod}})
	p1 := csitest.Pod("ns", "p1", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "db"}}})
	p2 := csitest.Pod("ns", "p2", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "db"}}})
	if err := e.mount(p1, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	for len(e.events.Events) > 0 {
		<-e.events.Events
	}
	calls := len(e.drv.Requests())

	want := "pod ns/p2 cannot use volume " + pvName + " (claim ns/db): the volume has access mode ReadWriteOncePod and is in use by pod ns/p1 on this node; it is mounted once that pod has released it"
	// A refusal is final: the wait returns with it, well before its
	// deadline (an hour), once the loop has planned the pod.
	err := e.mount(p2, time.Hour)
	var werr *WaitError
	if !errors.As(err, &werr) || !errors.Is(err, ErrFinal) || !werr.Final || werr.Err != nil {
		t.Fatalf("WaitForAttachAndMount = %v, want a final *WaitError", err)
	}
	if got := werr.Causes["data"]; got == nil || got.Error() != want || !errors.Is(got, ErrReadWriteOncePod) {
		t.Errorf("cause = %v\nwant    %s", got, want)
	}
	if !strings.Contains(err.Error(), `volume "data": `+want) {
		t.Errorf("wait error %q does not say why", err)
	}
	select {
	case ev := <-e.events.Events:
		// The kubelet's words, which upstream's ReadWriteOncePod suite
		// looks for; the wait error has nodevol's.
		if want := `Warning FailedMount MountVolume.SetUp failed for volume "` + pvName + `" : volume uses the ReadWriteOncePod access mode and is already in use by another pod`; ev != want {
			t.Errorf("event = %q\nwant    %q", ev, want)
		}
	default:
		t.Error("no FailedMount event")
	}
	// Planned again (a resync): no second event, no call.
	e.vm.inspect <- func(l *reconciler.Loop) { l.Resync(); l.PlanDirty(context.Background()) }
	eventually(t, "the loop idle", e.vm.idle)
	if n := len(e.drv.Requests()); n != calls {
		t.Errorf("the driver got %d calls after the refusal: %v", n-calls, e.drv.Requests()[calls:])
	}
	if got := e.vm.GetMountedVolumesForPod(p1.UID); len(got) != 1 {
		t.Errorf("p1's volumes = %v, want its one volume still mounted", got)
	}

	e.unmount(p1)
	waitIdle(t, e.vm) // p2 planned again without p1: its refusal is gone
	if err := e.mount(p2, 10*time.Second); err != nil {
		t.Fatalf("p2 after p1 left: %v", err)
	}
	select {
	case ev := <-e.events.Events:
		t.Errorf("unexpected event %q", ev)
	default:
	}
}
