package backoff

import (
	"time"

	"k8s.io/utils/clock"
)

// Timer is a loop's one wake-up timer on an injectable clock, for the
// "one timer and a select" loop: Set arms it for a time (re-armed only
// when that time changes), C goes in the select, and Fired is called when
// C has received. The zero value is not usable: use NewTimer. Not safe for
// concurrent use: the loop owns it.
type Timer struct {
	clock clock.Clock
	t     clock.Timer
	at    time.Time
}

// NewTimer returns a disarmed timer on c.
func NewTimer(c clock.Clock) *Timer { return &Timer{clock: c} }

// Set arms the timer to fire at at, or disarms it for a zero at. Setting
// the time it is armed for keeps the running timer.
func (t *Timer) Set(at time.Time) {
	if at.Equal(t.at) && (t.t != nil || at.IsZero()) {
		return
	}
	t.Stop()
	if at.IsZero() {
		return
	}
	t.at, t.t = at, t.clock.NewTimer(at.Sub(t.clock.Now()))
}

// After arms the timer to fire d from now.
func (t *Timer) After(d time.Duration) { t.Set(t.clock.Now().Add(d)) }

// C receives once the armed time has come. It is nil while disarmed: a
// select case on it never fires.
func (t *Timer) C() <-chan time.Time {
	if t.t == nil {
		return nil
	}
	return t.t.C()
}

// Fired records that C has received: the timer is disarmed.
func (t *Timer) Fired() { t.t, t.at = nil, time.Time{} }

// Stop disarms the timer.
func (t *Timer) Stop() {
	if t.t != nil {
		t.t.Stop()
	}
	t.Fired()
}
