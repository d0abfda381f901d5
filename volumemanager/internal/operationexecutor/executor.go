// Package operationexecutor runs volume operations (attach check, stage,
// publish, unpublish, unstage, node expansion) for the reconcile loop and
// turns a plugin's results into outcomes.
//
// It decides nothing. The loop's planner decides which operations run and
// when (it sees the operations in flight and the backoff of every key);
// this package runs them with a bound on concurrency (Runner), computes
// each one's Outcome synchronously (Do), and keeps the per-key backoff as
// plain data the planner reads (Backoff).
//
// Exclusion, as the planner applies it: an operation on a whole volume
// (Key.Pod empty: attach, stage, unstage, expand) runs alone on that
// volume; an operation on one pod's use of a volume (publish, unpublish)
// runs beside other pods' but never beside a whole-volume operation.
//
// Backoff: a failed operation makes its key wait (internal/backoff without
// jitter, since the scenario scripts print the waits: 500 ms, doubling,
// capped at 2m2s by default) before the same kind of operation may run
// again on it; a success forgets it, a failure of another kind starts over.
package operationexecutor

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/internal/backoff"
	"github.com/nodevol/nodevol/podvol"
)

// Key names what an operation works on.
type Key struct {
	Volume podvol.UniqueVolumeName
	// Pod is empty for operations on the whole volume.
	Pod types.UID
}

func (k Key) String() string {
	if k.Pod == "" {
		return string(k.Volume)
	}
	return string(k.Volume) + "/" + string(k.Pod)
}

// Runner runs functions in goroutines, at most a fixed number at once.
// The zero value is not usable; use NewRunner.
//
// The functions queue in the order given and are run by up to max worker
// goroutines, each running one after another until none is left, then
// exiting: a burst of thousands of operations reuses a few goroutines
// whose stacks have already grown to what an operation needs, rather than
// starting (and growing the stack of) one goroutine per operation, which
// was 7% of the CPU of unmounting 5,000 pods. At rest no goroutine is left.
type Runner struct {
	max int
	wg  sync.WaitGroup

	mu      sync.Mutex
	queue   []*job
	workers int
}

// job is one function given to Go: run by a worker or cancelled by its
// context, whichever claims it first.
type job struct {
	ctx       context.Context
	fn        func(context.Context)
	claimed   atomic.Bool
	stopAfter func() bool
}

// NewRunner returns a Runner that runs at most max functions at once
// (64 when max <= 0).
func NewRunner(max int) *Runner {
	if max <= 0 {
		max = 64
	}
	return &Runner{max: max}
}

// Go runs fn in a goroutine once a slot is free. If ctx ends first, fn
// is not run and cancelled is called instead, so that the caller always
// hears back exactly once.
func (r *Runner) Go(ctx context.Context, fn func(context.Context), cancelled func(error)) {
	r.wg.Add(1)
	j := &job{ctx: ctx, fn: fn}
	j.stopAfter = context.AfterFunc(ctx, func() {
		if j.claimed.CompareAndSwap(false, true) {
			defer r.wg.Done()
			cancelled(ctx.Err())
		}
	})
	r.mu.Lock()
	r.queue = append(r.queue, j)
	start := r.workers < r.max
	if start {
		r.workers++
	}
	r.mu.Unlock()
	if start {
		go r.work()
	}
}

// work runs queued jobs until there are none.
func (r *Runner) work() {
	for {
		r.mu.Lock()
		if len(r.queue) == 0 {
			r.workers--
			r.queue = nil // let the emptied array go
			r.mu.Unlock()
			return
		}
		j := r.queue[0]
		r.queue[0] = nil
		r.queue = r.queue[1:]
		r.mu.Unlock()
		if !j.claimed.CompareAndSwap(false, true) {
			continue // its context ended while it waited: cancelled was called
		}
		j.stopAfter()
		j.fn(j.ctx)
		r.wg.Done()
	}
}

// Wait blocks until every function started by Go has returned.
func (r *Runner) Wait() { r.wg.Wait() }

// BackoffOptions configure a Backoff. The zero value gives the kubelet's.
type BackoffOptions struct {
	// Initial is the wait after a first failure. Default 500 ms.
	Initial time.Duration
	// Max caps the doubling. Default 2m2s, as the kubelet.
	Max time.Duration
}

// Backoff is the retry state of every key whose last operation failed.
// It is plain data for one owner (the reconcile loop): not safe for
// concurrent use, and it reads no clock (callers pass now).
type Backoff struct {
	// policy has no jitter: the scenario scripts print the waits.
	policy backoff.Policy
	// byVolume indexes the entries by volume: the planner reads one
	// volume's at a time.
	byVolume map[podvol.UniqueVolumeName]map[Key]*BackoffEntry
}

// BackoffEntry is one key's retry state.
type BackoffEntry struct {
	// Kind is the operation that failed; the wait applies to it only.
	Kind OpKind
	// Failures counts consecutive failures of Kind.
	Failures int
	// Until is the earliest time Kind may run again on the key.
	Until time.Time
	// LastErr is the last failure.
	LastErr error
}

// NewBackoff returns an empty Backoff.
func NewBackoff(opts BackoffOptions) *Backoff {
	if opts.Initial <= 0 {
		opts.Initial = 500 * time.Millisecond
	}
	if opts.Max <= 0 {
		opts.Max = 2*time.Minute + 2*time.Second
	}
	return &Backoff{policy: backoff.Policy{Initial: opts.Initial, Max: opts.Max}, byVolume: map[podvol.UniqueVolumeName]map[Key]*BackoffEntry{}}
}

// Failed records a failure of kind on k at now and returns the wait
// before kind may run again on k.
func (b *Backoff) Failed(k Key, kind OpKind, err error, now time.Time) time.Duration {
	keys := b.byVolume[k.Volume]
	if keys == nil {
		keys = map[Key]*BackoffEntry{}
		b.byVolume[k.Volume] = keys
	}
	e := keys[k]
	if e == nil || e.Kind != kind {
		e = &BackoffEntry{Kind: kind}
		keys[k] = e
	}
	e.Failures++
	wait := b.policy.Delay(e.Failures)
	e.Until, e.LastErr = now.Add(wait), err
	return wait
}

// Succeeded forgets k's failures.
func (b *Backoff) Succeeded(k Key) {
	if keys := b.byVolume[k.Volume]; keys != nil {
		delete(keys, k)
		if len(keys) == 0 {
			delete(b.byVolume, k.Volume)
		}
	}
}

// Entry returns k's retry state, if its last operation failed.
func (b *Backoff) Entry(k Key) (BackoffEntry, bool) {
	e := b.byVolume[k.Volume][k]
	if e == nil {
		return BackoffEntry{}, false
	}
	return *e, true
}

// ForgetVolume drops the retry state of every key of a volume: the volume
// is gone, or the world changed in a way that may let it succeed now (its
// driver registered, its VolumeAttachment changed).
func (b *Backoff) ForgetVolume(v podvol.UniqueVolumeName) { delete(b.byVolume, v) }

// Volume returns the retry state of every failed key of a volume (nil
// when none failed). The caller must not modify it.
func (b *Backoff) Volume(v podvol.UniqueVolumeName) map[Key]*BackoffEntry { return b.byVolume[v] }
