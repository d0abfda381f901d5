package duequeue

import (
	"slices"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }

// TestSchedule: Set, SetEarlier and Remove decide when each key is due;
// Next is the earliest of them.
func TestSchedule(t *testing.T) {
	for _, tt := range []struct {
		name string
		// run schedules on q; changed is what its last SetEarlier
		// reported, when it calls one.
		run         func(q *Queue[string]) (changed bool)
		wantChanged bool
		want        map[string]time.Time
		wantNext    time.Time
	}{
		{"empty", func(q *Queue[string]) bool { return false }, false, map[string]time.Time{}, time.Time{}},
		{"set", func(q *Queue[string]) bool {
			q.Set("a", at(2))
			q.Set("b", at(1))
			return false
		}, false, map[string]time.Time{"a": at(2), "b": at(1)}, at(1)},
		{"set replaces, later too", func(q *Queue[string]) bool {
			q.Set("a", at(1))
			q.Set("a", at(3))
			return false
		}, false, map[string]time.Time{"a": at(3)}, at(3)},
		{"set zero removes", func(q *Queue[string]) bool {
			q.Set("a", at(1))
			q.Set("b", at(2))
			q.Set("a", time.Time{})
			return false
		}, false, map[string]time.Time{"b": at(2)}, at(2)},
		{"remove", func(q *Queue[string]) bool {
			q.Set("a", at(1))
			q.Remove("a")
			q.Remove("never")
			return false
		}, false, map[string]time.Time{}, time.Time{}},
		{"earlier of a new key", func(q *Queue[string]) bool { return q.SetEarlier("a", at(5)) },
			true, map[string]time.Time{"a": at(5)}, at(5)},
		{"earlier moves it", func(q *Queue[string]) bool {
			q.Set("a", at(5))
			return q.SetEarlier("a", at(4))
		}, true, map[string]time.Time{"a": at(4)}, at(4)},
		{"earlier keeps an earlier time", func(q *Queue[string]) bool {
			q.Set("a", at(5))
			return q.SetEarlier("a", at(6))
		}, false, map[string]time.Time{"a": at(5)}, at(5)},
		{"earlier keeps the same time", func(q *Queue[string]) bool {
			q.Set("a", at(5))
			return q.SetEarlier("a", at(5))
		}, false, map[string]time.Time{"a": at(5)}, at(5)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			q := New[string](clocktesting.NewFakeClock(t0))
			if got := tt.run(q); got != tt.wantChanged {
				t.Errorf("SetEarlier = %v, want %v", got, tt.wantChanged)
			}
			if q.Len() != len(tt.want) {
				t.Errorf("Len = %d, want %d", q.Len(), len(tt.want))
			}
			for k, want := range tt.want {
				if got, ok := q.At(k); !ok || !got.Equal(want) {
					t.Errorf("At(%q) = %v, %v; want %v", k, got, ok, want)
				}
			}
			if _, ok := q.At("never"); ok {
				t.Error(`At("never") found a key never set`)
			}
			if got := q.Next(); !got.Equal(tt.wantNext) {
				t.Errorf("Next = %v, want %v", got, tt.wantNext)
			}
		})
	}
}

// TestPop: the keys whose time has come (at now included) are taken, all
// of them by PopDue, the earliest by Pop; the others stay.
func TestPop(t *testing.T) {
	for _, tt := range []struct {
		name    string
		due     map[string]time.Time
		now     time.Time
		wantDue []string
		// wantPop is Pop's key ("" for none) on a queue like due.
		wantPop  string
		wantNext time.Time
	}{
		{"empty", nil, at(10), nil, "", time.Time{}},
		{"none due yet", map[string]time.Time{"a": at(2), "b": at(3)}, at(1), nil, "", at(2)},
		{"due at now", map[string]time.Time{"a": at(1), "b": at(3)}, at(1), []string{"a"}, "a", at(3)},
		{"overdue", map[string]time.Time{"a": at(1), "b": at(3)}, at(2), []string{"a"}, "a", at(3)},
		{"several due, earliest popped", map[string]time.Time{"a": at(2), "b": at(1), "c": at(9)}, at(5), []string{"a", "b"}, "b", at(9)},
		{"all due", map[string]time.Time{"a": at(2), "b": at(1)}, at(5), []string{"a", "b"}, "b", time.Time{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(t0)
			fill := func() *Queue[string] {
				q := New[string](clk)
				for k, at := range tt.due {
					q.Set(k, at)
				}
				return q
			}
			clk.SetTime(tt.now)

			q := fill()
			got := q.PopDue()
			slices.Sort(got)
			if !slices.Equal(got, tt.wantDue) {
				t.Errorf("PopDue = %q, want %q", got, tt.wantDue)
			}
			if next := q.Next(); !next.Equal(tt.wantNext) {
				t.Errorf("Next after PopDue = %v, want %v", next, tt.wantNext)
			}
			if again := q.PopDue(); len(again) != 0 {
				t.Errorf("second PopDue = %q, want none", again)
			}

			q = fill()
			k, ok := q.Pop()
			if ok != (tt.wantPop != "") || k != tt.wantPop {
				t.Errorf("Pop = %q, %v; want %q", k, ok, tt.wantPop)
			}
			if _, still := q.At(k); ok && still {
				t.Errorf("Pop left %q in the queue", k)
			}
			if q.Len() != len(tt.due)-len(k) {
				t.Errorf("Len after Pop = %d, want %d", q.Len(), len(tt.due)-len(k))
			}
		})
	}
}

// TestWakeAtTheEarliest: Arm sets one timer, for the earliest key; it
// follows the queue as keys come, move and go, and fires when the clock
// reaches that key's time, not before.
func TestWakeAtTheEarliest(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	q := New[string](clk)
	step := func(d time.Duration, wantFired bool, wantWaiters int) {
		t.Helper()
		clk.Step(d)
		gotFired := false
		select {
		case <-q.C():
			q.Fired()
			gotFired = true
		default:
		}
		if gotFired != wantFired {
			t.Fatalf("at %v: fired = %v, want %v", clk.Now().Sub(t0), gotFired, wantFired)
		}
		if got := clk.Waiters(); got != wantWaiters {
			t.Fatalf("at %v: %d timers, want %d", clk.Now().Sub(t0), got, wantWaiters)
		}
	}

	q.Arm() // empty: disarmed
	if q.C() != nil {
		t.Fatal("an empty queue armed a wake-up")
	}
	step(time.Hour, false, 0)
	clk.SetTime(t0)

	q.Set("late", at(10))
	q.Set("early", at(3))
	q.Arm()
	step(2*time.Second, false, 1) // 2 s: before the earliest
	q.Set("earlier", at(2))       // 2 s: due now
	q.Arm()                       // moved to 2 s: fires at once
	step(0, true, 0)
	if k, _ := q.Pop(); k != "earlier" {
		t.Fatalf("Pop = %q, want earlier", k)
	}
	q.Arm()
	step(time.Second, true, 0) // 3 s: early
	if k, _ := q.Pop(); k != "early" {
		t.Fatalf("Pop = %q, want early", k)
	}

	q.Arm() // 10 s
	q.Arm() // the same time: the same timer
	if clk.Waiters() != 1 {
		t.Fatalf("%d timers after arming twice for one time, want 1", clk.Waiters())
	}
	q.Remove("late")
	q.Arm() // nothing left: disarmed
	step(time.Hour, false, 0)

	q.Set("again", clk.Now().Add(time.Second))
	q.Arm()
	q.Stop()
	step(time.Hour, false, 0)
}
