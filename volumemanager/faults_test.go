package volumemanager

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volumemanager/internal/reconciler"
)

// TestPublishHangs: a driver whose NodePublishVolume hangs. While it hangs
// (until the test releases it), the wait errors say that the call is still
// running (not a bare deadline, and not the earlier attempt's error) and
// the pod counts as possibly mounted. Once the pod is deleted and the call
// returns (released, or cut off by the call timeout), the target is still
// unpublished and nothing of the pod is left.
func TestPublishHangs(t *testing.T) {
	tests := []struct {
		name string
		// callTimeout is the plugin's CSI call timeout; 0: the default
		// (2 minutes), longer than the test.
		callTimeout time.Duration
		// release ends the hung call by closing its Block; otherwise the
		// call timeout ends it.
		release bool
	}{
		{name: "released", release: true},
		// The call timeout ends the hung call: the checks made while it
		// hangs are the released case's (here they would race the
		// timeout); this case checks what follows the timeout.
		{name: "call timeout", callTimeout: time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{callTimeout: tc.callTimeout})
			e.claim("vol")
			// The first publish fails, so that an earlier error is on record;
			// the retry hangs.
			e.drv.Inject(csitest.Fault{Method: "NodePublishVolume", VolumeID: "handle-vol", Err: status.Error(codes.Internal, "no luck"), Times: 1})
			block := make(chan struct{})
			released := false
			release := func() {
				if !released {
					released = true
					close(block)
				}
			}
			defer release()
			e.drv.Inject(csitest.Fault{Method: "NodePublishVolume", VolumeID: "handle-vol", Block: block, Times: 1})
			pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "vol"}}})
			e.vm.AddPod(pod)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := e.drv.WaitForCalls(ctx, "NodePublishVolume", 2); err != nil {
				t.Fatal(err)
			}

			if tc.release { // the call hangs until release()
				err := waitShort(ctx, func(ctx context.Context) error { return e.vm.WaitForAttachAndMount(ctx, pod) })
				checkRunning(t, "WaitForAttachAndMount", err, "unmounted volumes=[data]")
				if !e.vm.HasPossiblyMountedVolumesForPod(pod.UID) {
					t.Fatal("a hung NodePublishVolume is not counted as possibly mounted")
				}
			}

			e.vm.DeletePod(pod)
			if tc.release {
				err := waitShort(ctx, func(ctx context.Context) error { return e.vm.WaitForUnmount(ctx, pod) })
				checkRunning(t, "WaitForUnmount", err, "volumes still mounted=[data]")
				if !e.vm.HasPossiblyMountedVolumesForPod(pod.UID) {
					t.Fatal("a hung NodePublishVolume of a deleted pod is not counted as possibly mounted")
				}
			}

			if tc.release {
				release()
			}
			if err := e.vm.WaitForUnmount(ctx, pod); err != nil {
				t.Fatal(err)
			}
			if e.vm.HasPossiblyMountedVolumesForPod(pod.UID) {
				t.Fatal("the pod still has possibly mounted volumes")
			}
			if got := e.drv.PublishedVolumes()["handle-vol"]; len(got) != 0 {
				t.Fatalf("still published at %v", got)
			}
			// The recording: the target of the hung publish is unpublished
			// after it, and last.
			var target string
			var last string
			for _, r := range e.drv.Requests() {
				switch req := r.Req.(type) {
				case *csi.NodePublishVolumeRequest:
					target, last = req.GetTargetPath(), r.Method
				case *csi.NodeUnpublishVolumeRequest:
					if req.GetTargetPath() != target {
						t.Errorf("NodeUnpublishVolume of %s, want %s", req.GetTargetPath(), target)
					}
					last = r.Method
				}
			}
			if last != "NodeUnpublishVolume" {
				t.Fatalf("last call on the target %s is %s, want NodeUnpublishVolume", target, last)
			}
		})
	}
}

// waitShort runs a wait with a context that ends soon, for a wait that must
// time out.
func waitShort(ctx context.Context, wait func(context.Context) error) error {
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	return wait(short)
}

// checkRunning checks that err is a *WaitError that says what is waited
// for and that volume "data"'s NodePublishVolume is still running.
func checkRunning(t *testing.T, what string, err error, waited string) {
	t.Helper()
	var we *WaitError
	if !errors.As(err, &we) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%s = %v (%T), want a *WaitError wrapping the deadline", what, err, err)
	}
	msg := err.Error()
	t.Logf("%s: %s", what, msg)
	for _, want := range []string{waited, `volume "data": NodePublishVolume still running after `} {
		if !strings.Contains(msg, want) {
			t.Errorf("%s = %q, does not say %q", what, msg, want)
		}
	}
	if strings.Contains(msg, "with no error reported") {
		t.Errorf("%s = %q, a bare deadline", what, msg)
	}
}

// TestConcurrentPodChurn: 8 goroutines make 1,000 AddPod and DeletePod
// calls on 50 pods, each with a volume of its own and one of 10 volumes
// shared with other pods (read-only for some). In a first phase every
// goroutine adds and deletes pods at random; once all are done, each sets
// the pods it owns (pod i belongs to goroutine i%8) to a fixed final plan,
// so the final set of pods is known. The manager must converge to exactly
// that set: every wanted pod has both volumes mounted, the driver has
// exactly their publications and the stagings they need, deleted pods have
// nothing possibly mounted, and the driver saw each target published and
// unpublished in turn (never published twice without an unpublish between,
// nor unpublished when not published), each volume likewise staged and
// unstaged.
func TestConcurrentPodChurn(t *testing.T) {
	const (
		pods       = 50
		shared     = 10
		goroutines = 8
		calls      = 1000
	)
	// The final plan: shared volume 9's pods all go, so it must end
	// unstaged as well as every own volume of a deleted pod.
	wanted := func(i int) bool { return i%3 != 0 && i%shared != shared-1 }

	var objs []runtime.Object
	for i := range shared {
		pvc, pv := csitest.BoundClaim("ns", fmt.Sprintf("shared-%d", i), csitest.PVSpec{
			Driver:      csitest.DefaultDriverName,
			Handle:      fmt.Sprintf("handle-shared-%d", i),
			AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteMany},
		})
		objs = append(objs, pvc, pv)
	}
	for i := range pods {
		pvc, pv := csitest.BoundClaim("ns", fmt.Sprintf("own-%d", i), csitest.PVSpec{Driver: csitest.DefaultDriverName, Handle: fmt.Sprintf("handle-own-%d", i)})
		objs = append(objs, pvc, pv)
	}
	e := newEnv(t, envOptions{objects: objs})
	all := make([]*v1.Pod, pods)
	for i := range all {
		all[i] = csitest.Pod("ns", fmt.Sprintf("p%d", i), csitest.PodSpec{Volumes: []csitest.PodVolume{
			{Name: "data", Claim: fmt.Sprintf("own-%d", i)},
			{Name: "shared", Claim: fmt.Sprintf("shared-%d", i%shared), ReadOnly: i%2 == 1},
		}})
	}

	// The calls, once the manager resolves pods (before, it would only
	// see the last of them).
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	select {
	case <-e.vm.ready:
	case <-ctx.Done():
		t.Fatal("the informers did not sync")
	}
	var random, done sync.WaitGroup
	random.Add(goroutines)
	for g := range goroutines {
		done.Go(func() {
			var mine []int
			for i := g; i < pods; i += goroutines {
				mine = append(mine, i)
			}
			rng := rand.New(rand.NewPCG(1, uint64(g)))
			for range calls/goroutines - len(mine) {
				if p := all[rng.IntN(pods)]; rng.IntN(2) == 0 {
					e.vm.AddPod(p)
				} else {
					e.vm.DeletePod(p)
				}
				if rng.IntN(2) == 0 {
					roundTrip(e.vm) // the loop acts between the calls
				}
			}
			random.Done()
			random.Wait() // nobody else touches my pods from here on
			for _, i := range mine {
				if wanted(i) {
					e.vm.AddPod(all[i])
				} else {
					e.vm.DeletePod(all[i])
				}
			}
		})
	}
	done.Wait()

	// The manager's answers.
	wantPublished := map[string][]string{} // volume handle -> target paths
	wantStaged := map[string]bool{}
	var wantInUse []podvol.UniqueVolumeName
	for i, p := range all {
		if !wanted(i) {
			if err := e.vm.WaitForUnmount(ctx, p); err != nil {
				t.Fatal(err)
			}
			if e.vm.HasPossiblyMountedVolumesForPod(p.UID) {
				t.Fatalf("deleted pod %s has possibly mounted volumes: %+v", p.Name, e.vm.asw.PodVolumes(p.UID))
			}
			continue
		}
		if err := e.vm.WaitForAttachAndMount(ctx, p); err != nil {
			t.Fatal(err)
		}
		mounted := e.vm.GetMountedVolumesForPod(p.UID)
		if len(mounted) != 2 || mounted[0].SpecName != "data" || mounted[1].SpecName != "shared" || mounted[1].ReadOnly != (i%2 == 1) {
			t.Fatalf("mounted volumes of pod %s = %+v, want data and shared", p.Name, mounted)
		}
		for j, h := range []string{fmt.Sprintf("handle-own-%d", i), fmt.Sprintf("handle-shared-%d", i%shared)} {
			if !strings.Contains(mounted[j].Path, "/pods/"+string(p.UID)+"/") {
				t.Fatalf("pod %s volume %s mounted at %s, outside the pod's directory", p.Name, mounted[j].SpecName, mounted[j].Path)
			}
			wantPublished[h] = append(wantPublished[h], mounted[j].Path)
			if !wantStaged[h] {
				wantStaged[h] = true
				wantInUse = append(wantInUse, podvol.CSIVolumeName(e.drv.DriverName(), h))
			}
		}
	}
	slices.Sort(wantInUse)

	// The driver's state once the manager is idle (the unstaging of the
	// volumes no pod wants has no wait of its own).
	driverState := func() string {
		var diffs []string
		published := e.drv.PublishedVolumes()
		for _, h := range slices.Sorted(maps.Keys(published)) {
			if _, ok := wantPublished[h]; !ok {
				diffs = append(diffs, fmt.Sprintf("%s published at %v, want nowhere", h, published[h]))
			}
		}
		for h, targets := range wantPublished {
			slices.Sort(targets)
			if got := published[h]; !slices.Equal(got, targets) {
				diffs = append(diffs, fmt.Sprintf("%s published at %v, want %v", h, got, targets))
			}
		}
		staged := map[string]bool{}
		for _, h := range slices.Sorted(maps.Keys(e.drv.StagedVolumes())) {
			staged[h] = true
			if !wantStaged[h] {
				diffs = append(diffs, fmt.Sprintf("%s staged, want unstaged", h))
			}
		}
		for h := range wantStaged {
			if !staged[h] {
				diffs = append(diffs, fmt.Sprintf("%s not staged", h))
			}
		}
		if got := knownVolumes(e.vm); !slices.Equal(got, wantInUse) {
			diffs = append(diffs, fmt.Sprintf("volumes in use %v, want %v", got, wantInUse))
		}
		slices.Sort(diffs)
		return strings.Join(diffs, "\n")
	}
	var diff string
	err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		diff = driverState()
		return diff == "" && e.vm.idle(), nil
	})
	if err != nil {
		t.Fatalf("the manager did not settle on the final pods (idle=%v):\n%s", e.vm.idle(), diff)
	}

	// The recording: publish and unpublish of each target, stage and
	// unstage of each volume, in turn.
	balance := map[string]int{}
	for _, r := range e.drv.Requests() {
		var key string
		var delta int
		switch req := r.Req.(type) {
		case *csi.NodeStageVolumeRequest:
			key, delta = "staged "+req.GetVolumeId(), 1
		case *csi.NodeUnstageVolumeRequest:
			key, delta = "staged "+req.GetVolumeId(), -1
		case *csi.NodePublishVolumeRequest:
			key, delta = "published "+req.GetVolumeId()+" at "+req.GetTargetPath(), 1
		case *csi.NodeUnpublishVolumeRequest:
			key, delta = "published "+req.GetVolumeId()+" at "+req.GetTargetPath(), -1
		default:
			continue
		}
		balance[key] += delta
		if b := balance[key]; b != 0 && b != 1 {
			t.Fatalf("%s: %s makes the count %d (calls minus undoing calls), want 0 or 1", key, r.Method, b)
		}
	}
	for key, b := range balance {
		var h, target string
		if _, err := fmt.Sscanf(key, "published %s at %s", &h, &target); err == nil {
			if want := slices.Contains(wantPublished[h], target); (b == 1) != want {
				t.Errorf("%s: count %d, want published=%v", key, b, want)
			}
		} else if _, err := fmt.Sscanf(key, "staged %s", &h); err == nil && (b == 1) != wantStaged[h] {
			t.Errorf("%s: count %d, want staged=%v", key, b, wantStaged[h])
		}
	}
	t.Logf("driver calls: %d NodePublishVolume, %d NodeUnpublishVolume, %d NodeStageVolume, %d NodeUnstageVolume",
		e.drv.Calls("NodePublishVolume"), e.drv.Calls("NodeUnpublishVolume"), e.drv.Calls("NodeStageVolume"), e.drv.Calls("NodeUnstageVolume"))
	select {
	case ev := <-e.events.Events:
		t.Errorf("an operation failed: event %q", ev)
	default:
	}
}

// roundTrip returns once the loop has run a no-op: callers that use it
// between their calls let the loop take them in and start operations as
// they come, rather than all at once. It orders nothing.
func roundTrip(vm *VolumeManager) {
	done := make(chan struct{})
	vm.inspect <- func(*reconciler.Loop) { close(done) }
	<-done
}
