package backoff

import (
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// fired reports whether the timer's channel has received, and if so
// records it.
func fired(tm *Timer) bool {
	select {
	case <-tm.C():
		tm.Fired()
		return true
	default:
		return false
	}
}

// TestTimer steps a fake clock through the timer's uses: armed, kept when
// set to the same time, moved, disarmed, re-armed after firing.
func TestTimer(t *testing.T) {
	for _, tt := range []struct {
		name string
		// run arms tm on clk and returns whether it should have fired
		// after the steps it made.
		run       func(tm *Timer, clk *clocktesting.FakeClock)
		wantFired bool
		// waiters is the number of timers pending on the clock after run.
		waiters int
	}{
		{"disarmed never fires", func(tm *Timer, clk *clocktesting.FakeClock) { clk.Step(time.Hour) }, false, 0},
		{"fires at the time set", func(tm *Timer, clk *clocktesting.FakeClock) {
			tm.Set(t0.Add(time.Second))
			clk.Step(time.Second)
		}, true, 0},
		{"not before", func(tm *Timer, clk *clocktesting.FakeClock) {
			tm.Set(t0.Add(time.Second))
			clk.Step(999 * time.Millisecond)
		}, false, 1},
		{"same time keeps the timer", func(tm *Timer, clk *clocktesting.FakeClock) {
			tm.Set(t0.Add(time.Second))
			tm.Set(t0.Add(time.Second))
		}, false, 1},
		{"moved later", func(tm *Timer, clk *clocktesting.FakeClock) {
			tm.Set(t0.Add(time.Second))
			tm.Set(t0.Add(2 * time.Second))
			clk.Step(time.Second)
		}, false, 1},
		{"moved earlier", func(tm *Timer, clk *clocktesting.FakeClock) {
			tm.Set(t0.Add(2 * time.Second))
			tm.Set(t0.Add(time.Second))
			clk.Step(time.Second)
		}, true, 0},
		{"zero disarms", func(tm *Timer, clk *clocktesting.FakeClock) {
			tm.Set(t0.Add(time.Second))
			tm.Set(time.Time{})
			clk.Step(time.Second)
		}, false, 0},
		{"stop disarms", func(tm *Timer, clk *clocktesting.FakeClock) {
			tm.After(time.Second)
			tm.Stop()
			clk.Step(time.Second)
		}, false, 0},
		{"after is from now", func(tm *Timer, clk *clocktesting.FakeClock) {
			clk.Step(time.Minute)
			tm.After(time.Second)
			clk.Step(time.Second)
		}, true, 0},
		{"re-armed for the same time after firing", func(tm *Timer, clk *clocktesting.FakeClock) {
			tm.Set(t0.Add(time.Second))
			clk.Step(time.Second)
			if !fired(tm) {
				t.Fatal("first arming did not fire")
			}
			tm.Set(t0.Add(time.Second)) // already due: fires at the next step
			clk.Step(0)
		}, true, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(t0)
			tm := NewTimer(clk)
			tt.run(tm, clk)
			if got := fired(tm); got != tt.wantFired {
				t.Errorf("fired = %v, want %v", got, tt.wantFired)
			}
			if got := clk.Waiters(); got != tt.waiters {
				t.Errorf("pending timers = %d, want %d", got, tt.waiters)
			}
		})
	}
}
