package volumemanager

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	fakeclock "k8s.io/utils/clock/testing"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// probe asks WaitForAttachAndMount with a context already done: it
// decides from what the manager knows now, at once.
func probe(t *testing.T, vm *VolumeManager, pod *v1.Pod) *WaitError {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var we *WaitError
	if err := vm.WaitForAttachAndMount(ctx, pod); !errors.As(err, &we) {
		t.Fatalf("WaitForAttachAndMount = %v, want a *WaitError", err)
	}
	return we
}

// TestWaitFinal: WaitForAttachAndMount returns at once (ErrFinal) on the
// errors that will not resolve by waiting, a claim missing or not bound
// only once it has been so for ClaimPendingGracePeriod (fake clock: the
// wait is woken by its timer, not by the deadline of its context); it keeps
// waiting on the others, and every error names its cause.
func TestWaitFinal(t *testing.T) {
	const grace = 10 * time.Second
	pvcHost, pvHost := csitest.BoundClaim("ns", "host", csitest.PVSpec{Driver: "unused", Handle: "h"})
	pvHost.Spec.CSI = nil
	pvHost.Spec.ISCSI = &v1.ISCSIPersistentVolumeSource{TargetPortal: "10.0.0.1:3260", IQN: "iqn.2001-04.com.example:t"}
	tests := []struct {
		name       string
		claim      string
		objects    func(e *env) []runtime.Object
		noRegister bool
		// want is the cause the error names.
		want string
		// afterGrace: final only after the grace period; final: final at once.
		afterGrace, final bool
	}{
		{name: "claim missing", claim: "nope", want: `volume "data": PVC ns/nope not found`, afterGrace: true},
		{
			name:  "claim pending",
			claim: "pend",
			objects: func(*env) []runtime.Object {
				return []runtime.Object{csitest.PVC("ns", "pend", "")}
			},
			want:       `volume "data": PVC ns/pend is not bound (phase "Pending")`,
			afterGrace: true,
		},
		{
			name:    "PV of a kind no plugin handles",
			claim:   "host",
			objects: func(*env) []runtime.Object { return []runtime.Object{pvcHost, pvHost} },
			want:    `volume "data": PV ` + pvHost.Name + ` of kind iscsi: no volume plugin handles it`,
			final:   true,
		},
		{
			name:  "driver not registered",
			claim: "data",
			objects: func(e *env) []runtime.Object {
				pvc, pv := csitest.BoundClaim("ns", "data", csitest.PVSpec{Driver: e.drv.DriverName(), Handle: "handle-data"})
				return []runtime.Object{pvc, pv}
			},
			noRegister: true,
			want:       "driver name csitest.nodevol.io not found in the list of registered CSI drivers",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := fakeclock.NewFakeClock(time.Now())
			e := newEnv(t, envOptions{clock: clk, claimGrace: grace, noRegister: tt.noRegister})
			if tt.objects != nil {
				e.create(tt.objects(e)...)
			}
			pod := csitest.Pod("ns", "web", csitest.PodSpec{Node: node, Volumes: []csitest.PodVolume{{Name: "data", Claim: tt.claim}}})
			if err := e.vm.AddPod(pod); err != nil {
				t.Fatal(err)
			}
			// The error the test is about: a resolution before the informers
			// have the objects says "not found" instead.
			cause := strings.TrimPrefix(tt.want, `volume "data": `)
			eventually(t, "the volume's error known", func() bool {
				err := e.vm.podErrors(pod.UID)["data"]
				return err != nil && strings.Contains(err.Error(), cause)
			})

			we := probe(t, e.vm, pod)
			if we.Final != tt.final || errors.Is(we, ErrFinal) != tt.final || !strings.Contains(we.Error(), tt.want) {
				t.Fatalf("at once: final %v, %v; want final %v, naming %q", we.Final, we, tt.final, tt.want)
			}
			if !tt.final && !errors.Is(we, context.Canceled) {
				t.Errorf("a wait ended by its context: %v, want it to unwrap to context.Canceled", we)
			}
			if tt.final {
				return
			}
			// A wait that the timer of the grace period ends (its own
			// deadline, real time, is far beyond the fake clock's step).
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- e.vm.WaitForAttachAndMount(ctx, pod) }()
			clk.Step(grace)
			if !tt.afterGrace {
				we := probe(t, e.vm, pod)
				if we.Final || !strings.Contains(we.Error(), tt.want) {
					t.Fatalf("after the grace period: %v, want not final, naming %q", we, tt.want)
				}
				return
			}
			var err error
			select {
			case err = <-done:
			case <-ctx.Done():
				t.Fatal("the wait did not end at the end of the grace period")
			}
			if !errors.Is(err, ErrFinal) || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("after the grace period: %v, want final, naming %q", err, tt.want)
			}
		})
	}
}

// TestPodOfAnotherNode: AddPod and UpdatePod refuse a pod bound to
// another node, naming the pod and both nodes, and nothing is mounted for
// it; WaitForAttachAndMount returns the same error at once (ErrFinal). A
// pod with no nodeName is accepted.
func TestPodOfAnotherNode(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.claim("data")
	foreign := csitest.Pod("ns", "web", csitest.PodSpec{Node: "node-2", Volumes: []csitest.PodVolume{{Name: "data", Claim: "data"}}})
	want := `volumemanager: pod ns/web is bound to node "node-2", not to this node "node-1": its volumes are not mounted here`
	if err := e.vm.AddPod(foreign); err == nil || err.Error() != want {
		t.Errorf("AddPod = %v, want %s", err, want)
	}
	if err := e.vm.UpdatePod(foreign); err == nil || err.Error() != want {
		t.Errorf("UpdatePod = %v, want %s", err, want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	err := e.vm.WaitForAttachAndMount(ctx, foreign)
	if wantWait := `pod ns/web: unmounted volumes=[data]: ` + want; err == nil || err.Error() != wantWait || !errors.Is(err, ErrFinal) {
		t.Errorf("WaitForAttachAndMount = %v, want final, %s", err, wantWait)
	}
	waitIdle(t, e.vm)
	if n := e.drv.Calls("NodeStageVolume") + e.drv.Calls("NodePublishVolume"); n != 0 {
		t.Errorf("%d NodeStageVolume/NodePublishVolume calls for a pod of another node", n)
	}

	unbound := csitest.Pod("ns", "static", csitest.PodSpec{Node: "", Volumes: []csitest.PodVolume{{Name: "data", Claim: "data"}}})
	if err := e.mount(unbound, 10*time.Second); err != nil {
		t.Fatalf("a pod with no nodeName: %v", err)
	}
}
