package volumemanager

import (
	"context"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"
	testclock "k8s.io/utils/clock/testing"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// TestRequiresRepublish: at each resync, the mounted volumes of a driver
// whose CSIDriver sets requiresRepublish are published again; those of
// other drivers are not.
func TestRequiresRepublish(t *testing.T) {
	again := csitest.New(t, csitest.Options{DriverName: "again.example.com", CreateTargetDirs: true, NoStageUnstage: true})
	once := csitest.New(t, csitest.Options{DriverName: "once.example.com", CreateTargetDirs: true, NoStageUnstage: true})
	pvcA, pvA := csitest.BoundClaim("ns", "a", again.DriverName(), "handle-a")
	pvcB, pvB := csitest.BoundClaim("ns", "b", once.DriverName(), "handle-b")
	client := fake.NewClientset(
		csitest.CSIDriver(again.DriverName(), false, csitest.DriverRequiresRepublish()),
		csitest.CSIDriver(once.DriverName(), false),
		pvcA, pvA, pvcB, pvB)
	clk := testclock.NewFakeClock(time.Now())
	vm, err := New(Config{NodeName: node, KubeClient: client, RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil), Clock: clk, ResyncPeriod: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- vm.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for _, d := range []*csitest.Server{again, once} {
		if err := vm.Drivers().Register(ctx, d.DriverName(), d.Endpoint()); err != nil {
			t.Fatal(err)
		}
	}
	pod := csitest.Pod("ns", "p", csitest.WithPVC("a", "a", false), csitest.WithPVC("b", "b", false))
	vm.AddPod(pod)
	if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	eventually(t, "resync ticker created", clk.HasWaiters)
	clk.Step(time.Minute)
	if err := again.WaitForCalls(ctx, "NodePublishVolume", 2); err != nil {
		t.Fatalf("requiresRepublish volume not published again: %v", err)
	}
	waitIdle(t, vm)
	if n := once.Calls("NodePublishVolume"); n != 1 {
		t.Errorf("volume of a driver without requiresRepublish published %d times, want 1", n)
	}
	if vols := vm.GetMountedVolumesForPod(pod.UID); len(vols) != 2 {
		t.Errorf("mounted volumes after republish: %+v, want 2", vols)
	}
}
