package volumemanager

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/utils/clock"
	fakeclock "k8s.io/utils/clock/testing"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// stepBeforeTimer is a fake clock that, once armed, steps itself by step
// just before it arms a timer of duration d: the clock moves between the
// caller's reading of the time and the arming of its timer.
type stepBeforeTimer struct {
	*fakeclock.FakeClock
	d, step time.Duration
	armed   atomic.Bool
}

func (c *stepBeforeTimer) NewTimer(d time.Duration) clock.Timer {
	if d == c.d && c.armed.CompareAndSwap(true, false) {
		c.Step(c.step)
	}
	return c.FakeClock.NewTimer(d)
}

// TestWaitFinalClockMovedBeforeTimer: a clock that reaches the end of the
// grace period after the wait judged the claim's error not final yet, but
// before it armed its timer, still ends the wait (ErrFinal). A fake timer
// armed after the step would fire only at the next step: the wait re-reads
// the clock once the timer is armed.
func TestWaitFinalClockMovedBeforeTimer(t *testing.T) {
	const grace = 7 * time.Second // no other timer of the manager lasts this long
	clk := &stepBeforeTimer{FakeClock: fakeclock.NewFakeClock(time.Now()), d: grace, step: grace}
	e := newEnv(t, envOptions{clock: clk, claimGrace: grace})
	pod := csitest.Pod("ns", "web", csitest.PodSpec{Node: node, Volumes: []csitest.PodVolume{{Name: "data", Claim: "nope"}}})
	if err := e.vm.AddPod(pod); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the volume's error known", func() bool { return e.vm.podErrors(pod.UID)["data"] != nil })
	clk.armed.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := e.vm.WaitForAttachAndMount(ctx, pod)
	if clk.armed.Load() {
		t.Fatal("the wait armed no timer of the grace period")
	}
	if !errors.Is(err, ErrFinal) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitForAttachAndMount = %v, want final (the grace period ended before the timer was armed)", err)
	}
}
