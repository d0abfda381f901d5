package operationexecutor

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodevol/nodevol/podvol"
)

func TestBackoff(t *testing.T) {
	k := Key{Volume: "v"}
	t0 := time.Unix(1000, 0)
	errX := errors.New("x")
	tests := []struct {
		name string
		run  func(b *Backoff) time.Duration // returns the last wait
		want time.Duration
	}{
		{"first failure waits the initial backoff", func(b *Backoff) time.Duration { return b.Failed(k, OpStage, errX, t0) }, 500 * time.Millisecond},
		{"doubles per failure", func(b *Backoff) time.Duration {
			b.Failed(k, OpStage, errX, t0)
			b.Failed(k, OpStage, errX, t0)
			return b.Failed(k, OpStage, errX, t0)
		}, 2 * time.Second},
		{"capped at 2m2s", func(b *Backoff) time.Duration {
			var w time.Duration
			for i := 0; i < 20; i++ {
				w = b.Failed(k, OpStage, errX, t0)
			}
			return w
		}, 2*time.Minute + 2*time.Second},
		{"another kind of operation starts over", func(b *Backoff) time.Duration {
			b.Failed(k, OpStage, errX, t0)
			b.Failed(k, OpStage, errX, t0)
			return b.Failed(k, OpUnstage, errX, t0)
		}, 500 * time.Millisecond},
		{"success forgets", func(b *Backoff) time.Duration {
			b.Failed(k, OpStage, errX, t0)
			b.Succeeded(k)
			return b.Failed(k, OpStage, errX, t0)
		}, 500 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBackoff(BackoffOptions{})
			if got := tc.run(b); got != tc.want {
				t.Fatalf("wait %v, want %v", got, tc.want)
			}
			e, ok := b.Entry(k)
			if !ok || !e.Until.Equal(t0.Add(tc.want)) || e.LastErr != errX {
				t.Fatalf("entry %+v", e)
			}
		})
	}
}

func TestBackoffByVolume(t *testing.T) {
	b := NewBackoff(BackoffOptions{})
	now := time.Unix(0, 0)
	b.Failed(Key{Volume: "v", Pod: "p1"}, OpPublish, errors.New("x"), now)
	b.Failed(Key{Volume: "v"}, OpStage, errors.New("y"), now)
	b.Failed(Key{Volume: "w"}, OpStage, errors.New("z"), now)
	if got := len(b.Volume("v")); got != 2 {
		t.Fatalf("volume v has %d entries, want 2", got)
	}
	b.ForgetVolume("v")
	if b.Volume("v") != nil {
		t.Fatal("v not forgotten")
	}
	if _, ok := b.Entry(Key{Volume: "w"}); !ok {
		t.Fatal("forgetting v forgot w")
	}
	b.Succeeded(Key{Volume: "w"})
	if b.Volume("w") != nil {
		t.Fatal("w not forgotten after success")
	}
}

func TestRunnerBoundsConcurrency(t *testing.T) {
	r := NewRunner(2)
	var running, peak atomic.Int32
	release := make(chan struct{})
	started := make(chan struct{}, 5)
	for i := 0; i < 5; i++ {
		r.Go(context.Background(), func(context.Context) {
			n := running.Add(1)
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
			started <- struct{}{}
			<-release
			running.Add(-1)
		}, func(error) { t.Error("cancelled") })
	}
	<-started
	<-started
	select {
	case <-started:
		t.Fatal("a third function started beside two running ones")
	default:
	}
	close(release)
	r.Wait()
	if peak.Load() != 2 {
		t.Fatalf("peak %d, want 2", peak.Load())
	}
}

func TestRunnerCancelledWhileWaiting(t *testing.T) {
	r := NewRunner(1)
	release, running := make(chan struct{}), make(chan struct{})
	r.Go(context.Background(), func(context.Context) { close(running); <-release }, func(error) {})
	<-running // the one slot is taken
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan error, 1)
	r.Go(ctx, func(context.Context) { t.Error("ran after its context ended") }, func(err error) { got <- err })
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled with %v", err)
	}
	close(release)
	r.Wait()
}

// TestRunnerQueuesInOrder: what waits for a slot is queued in the order
// given, not parked in a goroutine of its own, and runs in that order on
// the goroutine already running.
func TestRunnerQueuesInOrder(t *testing.T) {
	r := NewRunner(1)
	release, running := make(chan struct{}), make(chan struct{})
	r.Go(context.Background(), func(context.Context) { close(running); <-release }, func(error) { t.Error("cancelled") })
	<-running // the one slot is taken
	before := runtime.NumGoroutine()
	var order []int // appended by one function at a time
	for i := range 100 {
		r.Go(context.Background(), func(context.Context) { order = append(order, i) }, func(error) { t.Error("cancelled") })
	}
	if n := runtime.NumGoroutine() - before; n > 0 {
		t.Errorf("%d goroutines more for 100 queued functions, want none", n)
	}
	close(release)
	r.Wait()
	for i, got := range order {
		if got != i {
			t.Fatalf("run order %v, want the order given", order)
		}
	}
	if len(order) != 100 {
		t.Fatalf("%d functions ran, want 100", len(order))
	}
}

func TestKeyString(t *testing.T) {
	if s := (Key{Volume: podvol.UniqueVolumeName("v"), Pod: "p"}).String(); s != "v/p" {
		t.Fatal(s)
	}
	if s := (Key{Volume: "v"}).String(); s != "v" {
		t.Fatal(s)
	}
}
