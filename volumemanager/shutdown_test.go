package volumemanager

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/volumemanager/internal/reconciler"
)

// TestShutdownGracePeriod: when Run's context ends, a NodeStageVolume in
// flight goes on for ShutdownGracePeriod (the volume ends staged when the
// driver answers in time, and nothing new starts: no NodePublishVolume),
// and is cancelled when the period is over; Run returns after it in both
// cases. The driver answers a second after the call arrives, long after
// the shutdown: without the grace period the call would be cancelled.
func TestShutdownGracePeriod(t *testing.T) {
	for _, tt := range []struct {
		name       string
		grace      time.Duration
		answer     bool // the driver answers the call after a second; else never
		wantStaged bool
	}{
		{name: "in flight finishes", grace: time.Hour, answer: true, wantStaged: true},
		{name: "cancelled when the period is over", grace: 50 * time.Millisecond, answer: false, wantStaged: false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
			pvc, pv := csitest.BoundClaim("ns", "data", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-data"})
			client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{}), pvc, pv)
			vm, err := New(Config{NodeName: node, KubeClient: client, RootDir: t.TempDir(),
				Mounter: mount.NewFakeMounter(nil), ShutdownGracePeriod: tt.grace})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ran := make(chan error, 1)
			go func() { ran <- vm.Run(ctx) }()
			if err := vm.Drivers().Register(ctx, drv.DriverName(), drv.Endpoint()); err != nil {
				t.Fatal(err)
			}
			fault := csitest.Fault{Method: "NodeStageVolume", Delay: time.Second, Times: 1}
			if !tt.answer {
				fault = csitest.Fault{Method: "NodeStageVolume", Block: make(chan struct{}), Times: 1}
			}
			drv.Inject(fault)
			vm.MarkPodsSynced()
			vm.AddPod(csitest.Pod("ns", "web", csitest.PodSpec{Node: node, Volumes: []csitest.PodVolume{{Name: "data", Claim: "data"}}}))
			waitCtx, done := context.WithTimeout(context.Background(), 10*time.Second)
			defer done()
			if err := drv.WaitForCalls(waitCtx, "NodeStageVolume", 1); err != nil {
				t.Fatal(err)
			}

			cancel()
			select {
			case err := <-ran:
				if err != nil {
					t.Fatalf("Run: %v", err)
				}
			case <-waitCtx.Done():
				t.Fatal("Run did not return after the shutdown")
			}
			if _, staged := drv.StagedVolumes()["handle-data"]; staged != tt.wantStaged {
				t.Errorf("staged after the shutdown = %v, want %v", staged, tt.wantStaged)
			}
			if n := drv.Calls("NodePublishVolume"); n != 0 {
				t.Errorf("NodePublishVolume called %d times after the shutdown, want 0", n)
			}
		})
	}
}

// TestHealthy: Healthy fails before Run, while the informers have not
// listed (Config.ClusterInformers: the volumes'), while the loop does not
// answer and once Run's context is done; it is nil while Run runs normally.
func TestHealthy(t *testing.T) {
	client := fake.NewClientset()
	listed := make(chan struct{})
	client.PrependReactor("list", "persistentvolumes", func(clienttesting.Action) (bool, runtime.Object, error) {
		<-listed
		return false, nil, nil
	})
	vm, err := New(Config{NodeName: node, KubeClient: client, RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil), ClusterInformers: true})
	if err != nil {
		t.Fatal(err)
	}
	check := func(label, want string) {
		t.Helper()
		ctx, done := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer done()
		err := vm.Healthy(ctx)
		switch {
		case want == "" && err != nil:
			t.Errorf("%s: Healthy = %v, want nil", label, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%s: Healthy = %v, want an error containing %q", label, err, want)
		}
	}
	check("before Run", "Run has not been called")

	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- vm.Run(ctx) }()
	eventually(t, "Run started", func() bool { return vm.runCtx.Load() != nil })
	check("informers listing", "informers have not synced yet")
	close(listed)
	eventually(t, "healthy", func() bool { return vm.Healthy(context.Background()) == nil })

	// A loop busy with one step beyond the probe's deadline is stuck.
	stuck, unstick := make(chan struct{}), make(chan struct{})
	vm.inspect <- func(*reconciler.Loop) { close(stuck); <-unstick }
	<-stuck
	check("loop stuck", "reconcile loop did not answer")
	close(unstick)
	check("loop going again", "")

	cancel()
	if err := <-ran; err != nil {
		t.Fatalf("Run: %v", err)
	}
	check("after Run", "stopping or stopped")
}
