package operationexecutor

import (
	"context"
	"errors"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/nodevol/nodevol/cache"
)

// blocker is an operation body that runs until released.
type blocker struct{ release chan struct{} }

func newBlocker() *blocker { return &blocker{release: make(chan struct{})} }
func (b *blocker) fn(ctx context.Context) error {
	select {
	case <-b.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func TestExclusion(t *testing.T) {
	v := cache.UniqueVolumeName("vol")
	tests := []struct {
		name     string
		running  Key
		next     Key
		wantBusy bool
	}{
		{"volume op blocks same volume op", Key{Volume: v}, Key{Volume: v}, true},
		{"volume op blocks pod op", Key{Volume: v}, Key{Volume: v, Pod: "p1"}, true},
		{"pod op blocks volume op", Key{Volume: v, Pod: "p1"}, Key{Volume: v}, true},
		{"pod op blocks same pod op", Key{Volume: v, Pod: "p1"}, Key{Volume: v, Pod: "p1"}, true},
		{"pods of one volume run in parallel", Key{Volume: v, Pod: "p1"}, Key{Volume: v, Pod: "p2"}, false},
		{"other volumes run in parallel", Key{Volume: v}, Key{Volume: "other"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := New(Options{})
			b := newBlocker()
			if err := e.Run(context.Background(), Operation{Key: tc.running, Name: "a", Fn: b.fn}); err != nil {
				t.Fatal(err)
			}
			b2 := newBlocker()
			err := e.Run(context.Background(), Operation{Key: tc.next, Name: "b", Fn: b2.fn})
			if gotBusy := errors.Is(err, ErrBusy); gotBusy != tc.wantBusy {
				t.Fatalf("Run = %v, want busy=%v", err, tc.wantBusy)
			}
			close(b.release)
			close(b2.release)
			e.Wait()
			if e.IsRunning(v) {
				t.Fatal("still running after Wait")
			}
			// Once released the key is free again.
			if err := e.Run(context.Background(), Operation{Key: tc.next, Name: "b", Fn: func(context.Context) error { return nil }}); err != nil {
				t.Fatalf("after release: %v", err)
			}
			e.Wait()
		})
	}
}

func TestBackoff(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	e := New(Options{Clock: clk, InitialBackoff: 500 * time.Millisecond, MaxBackoff: 2 * time.Second})
	k := Key{Volume: "v"}
	boom := errors.New("boom")
	fail := Operation{Key: k, Name: "mount_device", Fn: func(context.Context) error { return boom }}
	run := func(op Operation) error {
		t.Helper()
		err := e.Run(context.Background(), op)
		e.Wait()
		return err
	}
	if err := run(fail); err != nil {
		t.Fatal(err)
	}
	// Steps: after each failure the wait doubles up to the cap.
	for i, wait := range []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 2 * time.Second} {
		var be *BackoffError
		if err := e.Run(context.Background(), fail); !errors.As(err, &be) || be.RetryAfter != wait || !errors.Is(be.LastErr, boom) {
			t.Fatalf("step %d: Run = %v, want backoff %v", i, err, wait)
		}
		clk.Step(wait - time.Millisecond)
		if err := e.Run(context.Background(), fail); err == nil {
			t.Fatalf("step %d: ran 1ms early", i)
		}
		clk.Step(time.Millisecond)
		if err := run(fail); err != nil {
			t.Fatalf("step %d: Run after wait = %v", i, err)
		}
	}
	// Another operation on the key is not held back, and its success forgets the backoff.
	if err := run(Operation{Key: k, Name: "unmount_device", Fn: func(context.Context) error { return nil }}); err != nil {
		t.Fatal(err)
	}
	if err := run(fail); err != nil {
		t.Fatalf("backoff not reset by success: %v", err)
	}
	// Forget drops the backoff of the volume.
	e.Forget("v")
	if err := run(fail); err != nil {
		t.Fatalf("after Forget: %v", err)
	}
}

func TestDoneAndConcurrencyLimit(t *testing.T) {
	e := New(Options{MaxConcurrent: 1})
	b := newBlocker()
	done := make(chan error, 2)
	holding := make(chan struct{})
	first := func(ctx context.Context) error { close(holding); return b.fn(ctx) }
	if err := e.Run(context.Background(), Operation{Key: Key{Volume: "a"}, Name: "x", Fn: first, Done: func(err error) { done <- err }}); err != nil {
		t.Fatal(err)
	}
	<-holding // the first operation holds the only slot
	started := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	// The second operation waits for a slot; cancelling its context ends it without running.
	if err := e.Run(ctx, Operation{Key: Key{Volume: "b"}, Name: "x", Fn: func(context.Context) error { close(started); return nil }, Done: func(err error) { done <- err }}); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("waiting op ended with %v", err)
	}
	select {
	case <-started:
		t.Fatal("operation ran beyond the concurrency limit")
	default:
	}
	close(b.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	e.Wait()
}

// TestNeeded: an operation no longer needed once its key is held is
// dropped without running, applying or asking for more, and frees its key.
func TestNeeded(t *testing.T) {
	for _, needed := range []bool{false, true} {
		e := New(Options{})
		var ran, applied, done bool
		op := Operation{
			Key: Key{Volume: "vol", Pod: "p"}, Name: "volume_mount",
			Fn:     func(context.Context) error { ran = true; return nil },
			Apply:  func(error) { applied = true },
			Done:   func(error) { done = true },
			Needed: func() bool { return needed },
		}
		if err := e.Run(context.Background(), op); err != nil {
			t.Fatal(err)
		}
		e.Wait()
		if ran != needed || applied != needed || done != needed {
			t.Errorf("needed=%v: ran %v, applied %v, done %v", needed, ran, applied, done)
		}
		if e.IsRunning("vol") {
			t.Errorf("needed=%v: key still held", needed)
		}
	}
}
