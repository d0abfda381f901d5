// Package duequeue holds keys each due at a time, and wakes the loop that
// owns them at the earliest.
//
// It is the schedule of a loop that does work per key later (a retry after
// a backoff, a periodic refresh, a renewal): the loop sets when each key is
// due, takes the keys whose time has come, and waits in its select on C
// until the next one. What a key is due for (the backoff that chose the
// time, the hand-off to a work list) stays with the loop.
package duequeue

import (
	"time"

	"k8s.io/utils/clock"

	"github.com/nodevol/nodevol/internal/backoff"
)

// Queue is a set of keys, each with the time it is next due, on an
// injectable clock. The zero value is not usable: use New. Not safe for
// concurrent use: its owner locks it, and only the goroutine that waits
// arms and fires the wake-up (Arm, C, Fired, Stop).
type Queue[K comparable] struct {
	clock clock.Clock
	at    map[K]time.Time
	wake  *backoff.Timer
}

// New returns an empty queue on c, its wake-up disarmed.
func New[K comparable](c clock.Clock) *Queue[K] {
	return &Queue[K]{clock: c, at: map[K]time.Time{}, wake: backoff.NewTimer(c)}
}

// Set makes k due at at, replacing any time it had; a zero at removes k.
func (q *Queue[K]) Set(k K, at time.Time) {
	if at.IsZero() {
		delete(q.at, k)
		return
	}
	q.at[k] = at
}

// SetEarlier makes k due at at unless it is due at or before at already,
// and reports whether it did.
func (q *Queue[K]) SetEarlier(k K, at time.Time) bool {
	if cur, ok := q.at[k]; ok && !at.Before(cur) {
		return false
	}
	q.at[k] = at
	return true
}

// Remove drops k.
func (q *Queue[K]) Remove(k K) { delete(q.at, k) }

// At returns when k is due; false if it is not in the queue.
func (q *Queue[K]) At(k K) (time.Time, bool) {
	at, ok := q.at[k]
	return at, ok
}

// Len is the number of keys in the queue.
func (q *Queue[K]) Len() int { return len(q.at) }

// Pop removes and returns the key due earliest if its time has come (of
// several due at the same time, any one); false if none is due yet.
func (q *Queue[K]) Pop() (K, bool) {
	k, at, ok := q.earliest()
	if !ok || at.After(q.clock.Now()) {
		var none K
		return none, false
	}
	delete(q.at, k)
	return k, true
}

// PopDue removes and returns every key whose time has come, in no order.
func (q *Queue[K]) PopDue() []K {
	now := q.clock.Now()
	var due []K
	for k, at := range q.at {
		if !now.Before(at) {
			delete(q.at, k)
			due = append(due, k)
		}
	}
	return due
}

// Next returns the earliest time a key is due; zero for an empty queue.
func (q *Queue[K]) Next() time.Time {
	_, at, _ := q.earliest()
	return at
}

// earliest returns the key due first and its time; false for an empty
// queue.
func (q *Queue[K]) earliest() (first K, at time.Time, found bool) {
	for k, t := range q.at {
		if !found || t.Before(at) {
			first, at, found = k, t, true
		}
	}
	return first, at, found
}

// Arm sets the wake-up for Next (an empty queue: disarmed). Arming it for
// the time it is armed for keeps the running timer.
func (q *Queue[K]) Arm() { q.wake.Set(q.Next()) }

// C receives once the time Arm set has come: a case of the owner's select.
// It is nil while disarmed, so the case never fires.
func (q *Queue[K]) C() <-chan time.Time { return q.wake.C() }

// Fired records that C has received: the wake-up is disarmed until the
// next Arm.
func (q *Queue[K]) Fired() { q.wake.Fired() }

// Stop disarms the wake-up, releasing its timer.
func (q *Queue[K]) Stop() { q.wake.Stop() }
