package volumemanager

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/podvol"
)

// waitUnstaged waits (30 s at most) until every volume of vm is torn down
// to the end, unstage included.
func waitUnstaged(t *testing.T, vm *VolumeManager) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := vm.WaitForUnstaged(ctx); err != nil {
		t.Fatal(err)
	}
}

// unstagedNow is WaitForUnstaged's report of the state as it is now.
func unstagedNow(vm *VolumeManager) error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return vm.WaitForUnstaged(ctx)
}

// TestWaitForUnstagedWaitsForNodeUnstage: WaitForUnmount returns once the
// deleted pod's volume is unpublished, while its NodeUnstageVolume is
// still held by the driver; WaitForUnstaged returns only once it has
// returned, and meanwhile names the volume and the call.
func TestWaitForUnstagedWaitsForNodeUnstage(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.claim("data")
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "data"}}})
	if err := e.mount(pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	e.drv.Inject(csitest.Fault{Method: "NodeUnstageVolume", Block: release})
	e.unmount(pod) // WaitForUnmount returned
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.drv.WaitForCalls(ctx, "NodeUnstageVolume", 1); err != nil {
		t.Fatal(err)
	}
	if _, staged := e.drv.StagedVolumes()["handle-data"]; !staged {
		t.Fatal("the volume is not staged any more while its NodeUnstageVolume is held")
	}
	done := make(chan error, 1)
	go func() { done <- e.vm.WaitForUnstaged(ctx) }()

	name := podvol.CSIVolumeName(e.drv.DriverName(), "handle-data")
	err := unstagedNow(e.vm)
	var uerr *UnstageWaitError
	if !errors.As(err, &uerr) || !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitForUnstaged with its context done = %v, want an *UnstageWaitError wrapping context.Canceled", err)
	}
	if len(uerr.Volumes) != 1 || uerr.Volumes[0] != name || len(uerr.Pods) != 0 {
		t.Errorf("volumes %v, pods %v; want [%s] and no pod", uerr.Volumes, uerr.Pods, name)
	}
	for _, want := range []string{"volumes not torn down=[" + string(name) + "]", `volume "` + string(name) + `": staged`, "NodeUnstageVolume still running after"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	select {
	case err := <-done:
		t.Fatalf("WaitForUnstaged returned %v while NodeUnstageVolume is held", err)
	default:
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("WaitForUnstaged after the unstage was released: %v", err)
	}
	if got := e.drv.StagedVolumes(); len(got) != 0 {
		t.Errorf("WaitForUnstaged returned with %v still staged", got)
	}
}

// TestWaitForUnstagedNamesUnstageError: an unstage that fails is named
// with its error, although no pod is left to carry it; once the driver
// recovers, the wait ends.
func TestWaitForUnstagedNamesUnstageError(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.claim("data")
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "data"}}})
	if err := e.mount(pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	e.drv.Inject(csitest.Fault{Method: "NodeUnstageVolume", Err: status.Error(codes.Internal, "device busy in the array")})
	e.unmount(pod)
	var last error
	name := podvol.CSIVolumeName(e.drv.DriverName(), "handle-data")
	// Polled from outside the loop, the error may show before the loop
	// has applied the outcome to the volume's state: wait for both.
	eventually(t, "the unstage error and the uncertain device in WaitForUnstaged's error", func() bool {
		last = unstagedNow(e.vm)
		return last != nil && strings.Contains(last.Error(), "device busy in the array") &&
			strings.Contains(last.Error(), `volume "`+string(name)+`": possibly staged`)
	})
	var uerr *UnstageWaitError
	if !errors.As(last, &uerr) || uerr.Causes[name] == nil || !strings.Contains(last.Error(), `volume "`+string(name)+`": possibly staged`) {
		t.Fatalf("error %v: want volume %s named as possibly staged (a failed unstage leaves it uncertain), with its cause", last, name)
	}
	e.drv.ClearFaults()
	e.vm.in.Retry(name) // the driver recovered: the backoff is not what is tested
	waitUnstaged(t, e.vm)
}

// TestWaitForUnstagedPods: a pod added whose volume cannot be resolved
// (its claim does not exist) keeps the wait going, named; deleted, the
// wait ends although nothing was ever set up for it.
func TestWaitForUnstagedPods(t *testing.T) {
	e := newEnv(t, envOptions{})
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "missing"}}})
	if err := e.vm.AddPod(pod); err != nil {
		t.Fatal(err)
	}
	err := unstagedNow(e.vm)
	var uerr *UnstageWaitError
	if !errors.As(err, &uerr) || len(uerr.Pods) != 1 || uerr.Pods[0] != "ns/p" || !strings.Contains(err.Error(), "pods with volumes=[ns/p]") {
		t.Fatalf("WaitForUnstaged with a pod added = %v, want it to name pod ns/p", err)
	}
	e.vm.DeletePod(pod)
	waitUnstaged(t, e.vm)
}

// TestWaitForUnstagedAfterRun: once Run has returned nothing more is torn
// down: the wait returns at once, naming what is left.
func TestWaitForUnstagedAfterRun(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.claim("data")
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "data"}}})
	if err := e.mount(pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	e.stop()
	err := e.vm.WaitForUnstaged(context.Background())
	if !errors.Is(err, errStopped) || !strings.Contains(err.Error(), "published for pod ns/p") || !strings.Contains(err.Error(), "wanted by pod ns/p") {
		t.Fatalf("WaitForUnstaged after Run = %v, want the stopped error naming the published volume", err)
	}
}

// TestUnstageWaitErrorText: what the error says of each volume.
func TestUnstageWaitErrorText(t *testing.T) {
	const a, b podvol.UniqueVolumeName = "kubernetes.io/csi/d^a", "kubernetes.io/csi/d^b"
	tests := []struct {
		name string
		err  *UnstageWaitError
		want string
	}{
		{"staged, unstage running, last error", &UnstageWaitError{Volumes: []podvol.UniqueVolumeName{a},
			Left:    map[podvol.UniqueVolumeName][]string{a: {"staged"}},
			Running: map[podvol.UniqueVolumeName]string{a: "NodeUnstageVolume still running after 2s"},
			Causes:  map[podvol.UniqueVolumeName]error{a: errors.New("rpc error: busy")},
			Err:     context.DeadlineExceeded},
			`volumes not torn down=[kubernetes.io/csi/d^a]; volume "kubernetes.io/csi/d^a": staged, NodeUnstageVolume still running after 2s, last error: rpc error: busy: context deadline exceeded`},
		{"waiting, a pod", &UnstageWaitError{Volumes: []podvol.UniqueVolumeName{a, b},
			Left:    map[podvol.UniqueVolumeName][]string{a: {"staged"}, b: {"wanted by pod ns/p"}},
			Waiting: map[podvol.UniqueVolumeName][]string{a: {"unstage held: found on disk"}},
			Pods:    []string{"ns/p"}, Err: errStopped},
			`volumes not torn down=[kubernetes.io/csi/d^a kubernetes.io/csi/d^b]; volume "kubernetes.io/csi/d^a": staged, unstage held: found on disk; volume "kubernetes.io/csi/d^b": wanted by pod ns/p; pods with volumes=[ns/p]: ` + errStopped.Error()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.err.Error(); got != tt.want {
				t.Errorf("Error() =\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
}
