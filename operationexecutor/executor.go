// Package operationexecutor runs volume operations (attach check, stage,
// publish, unpublish, unstage) with per-key exclusion and per-key exponential
// backoff, and turns a plugin's results into outcomes for the reconciler.
//
// Exclusion: an operation on a whole volume (Key.Pod empty: attach, stage,
// unstage) excludes every other operation on that volume; an operation on one
// pod's use of a volume (publish, unpublish) excludes only the whole-volume
// operations and the same pod's other operations on that volume. So a volume
// is never staged and unstaged at once, a pod's mount and unmount never
// overlap, and many pods may publish one shared volume in parallel.
//
// Backoff: a failed operation makes its key wait (500 ms, doubling, capped at
// 2m2s by default) before the same operation may run again; a success, or a
// different operation on the key, forgets it.
package operationexecutor

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/nodevol/nodevol/cache"
)

// Key names what an operation works on.
type Key struct {
	Volume cache.UniqueVolumeName
	// Pod is empty for operations on the whole volume.
	Pod types.UID
}

func (k Key) String() string {
	if k.Pod == "" {
		return string(k.Volume)
	}
	return string(k.Volume) + "/" + string(k.Pod)
}

// ErrBusy is returned by Run when a conflicting operation is running.
var ErrBusy = errors.New("another operation is running on this volume")

// BackoffError is returned by Run while a key waits after a failure.
type BackoffError struct {
	Key        Key
	Op         string
	RetryAfter time.Duration
	LastErr    error
}

func (e *BackoffError) Error() string {
	return fmt.Sprintf("operation %s for %s: no retries permitted for %v (last error: %v)", e.Op, e.Key, e.RetryAfter, e.LastErr)
}

// Options configure an Executor. The zero value is valid.
type Options struct {
	// Clock drives backoff. Default: the real clock.
	Clock clock.Clock
	// InitialBackoff is the wait after a first failure. Default 500 ms.
	InitialBackoff time.Duration
	// MaxBackoff caps the doubling. Default 2m2s, as the kubelet.
	MaxBackoff time.Duration
	// MaxConcurrent bounds operations running at once. Default 64.
	MaxConcurrent int
}

// Operation is one unit of work.
type Operation struct {
	Key Key
	// Name names the operation ("volume_mount", ...); backoff is per key and name.
	Name string
	// Fn does the work. Its error decides the backoff.
	Fn func(ctx context.Context) error
	// Apply, if set, is called with Fn's error while the key is still held:
	// the place to record the outcome, so that no conflicting operation can
	// start before the actual state shows what this one did.
	Apply func(err error)
	// Done, if set, is called with Fn's error after the key is released:
	// the place to ask for the next step.
	Done func(err error)
	// Needed, if set, is asked once the key is held, before Fn: false means
	// that an operation that finished since this one was planned did its
	// work, and it is dropped (no Fn, Apply or Done; backoff untouched).
	Needed func() bool
}

// Executor runs operations. It is safe for concurrent use.
type Executor struct {
	opts Options
	sem  chan struct{}
	wg   sync.WaitGroup

	mu      sync.Mutex
	running map[Key]string                 // key -> operation name
	perVol  map[cache.UniqueVolumeName]int // running operations per volume
	backoff map[Key]*backoffState          // failed keys
}

type backoffState struct {
	op      string
	lastErr error
	at      time.Time
	wait    time.Duration
}

// New returns an Executor.
func New(opts Options) *Executor {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.InitialBackoff <= 0 {
		opts.InitialBackoff = 500 * time.Millisecond
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 2*time.Minute + 2*time.Second
	}
	if opts.MaxConcurrent <= 0 {
		opts.MaxConcurrent = 64
	}
	return &Executor{
		opts:    opts,
		sem:     make(chan struct{}, opts.MaxConcurrent),
		running: map[Key]string{},
		perVol:  map[cache.UniqueVolumeName]int{},
		backoff: map[Key]*backoffState{},
	}
}

// Run starts op in a goroutine unless a conflicting operation runs (ErrBusy)
// or op's key is backing off after a failure of the same operation
// (*BackoffError, which says how long to wait). The operation gets ctx; it
// waits for a concurrency slot inside its goroutine.
func (e *Executor) Run(ctx context.Context, op Operation) error {
	e.mu.Lock()
	if err := e.admit(op); err != nil {
		e.mu.Unlock()
		return err
	}
	e.running[op.Key] = op.Name
	e.perVol[op.Key.Volume]++
	e.wg.Add(1)
	e.mu.Unlock()

	go func() {
		defer e.wg.Done()
		if op.Needed != nil && !op.Needed() {
			e.release(op)
			return
		}
		var err error
		select {
		case e.sem <- struct{}{}:
			err = op.Fn(ctx)
			<-e.sem
		case <-ctx.Done():
			err = ctx.Err()
		}
		if op.Apply != nil {
			op.Apply(err)
		}
		e.finish(op, err)
		if op.Done != nil {
			op.Done(err)
		}
	}()
	return nil
}

// admit checks exclusion and backoff; e.mu is held.
func (e *Executor) admit(op Operation) error {
	if _, ok := e.running[op.Key]; ok {
		return ErrBusy
	}
	if op.Key.Pod == "" {
		if e.perVol[op.Key.Volume] > 0 {
			return ErrBusy
		}
	} else if _, ok := e.running[Key{Volume: op.Key.Volume}]; ok {
		return ErrBusy
	}
	if b := e.backoff[op.Key]; b != nil && b.op == op.Name {
		if left := b.at.Add(b.wait).Sub(e.opts.Clock.Now()); left > 0 {
			return &BackoffError{Key: op.Key, Op: op.Name, RetryAfter: left, LastErr: b.lastErr}
		}
	}
	return nil
}

// release frees op's key; e.mu is held.
func (e *Executor) releaseLocked(op Operation) {
	delete(e.running, op.Key)
	if e.perVol[op.Key.Volume]--; e.perVol[op.Key.Volume] <= 0 {
		delete(e.perVol, op.Key.Volume)
	}
}

// release frees the key of an operation that was dropped.
func (e *Executor) release(op Operation) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.releaseLocked(op)
}

func (e *Executor) finish(op Operation, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.releaseLocked(op)
	if err == nil {
		delete(e.backoff, op.Key)
		return
	}
	b := e.backoff[op.Key]
	switch {
	case b == nil || b.op != op.Name:
		b = &backoffState{op: op.Name, wait: e.opts.InitialBackoff}
		e.backoff[op.Key] = b
	default:
		b.wait *= 2
		if b.wait > e.opts.MaxBackoff {
			b.wait = e.opts.MaxBackoff
		}
	}
	b.lastErr, b.at = err, e.opts.Clock.Now()
}

// Forget drops the backoff of every key of a volume, for example when the
// volume is gone or its driver has just registered.
func (e *Executor) Forget(volume cache.UniqueVolumeName) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for k := range e.backoff {
		if k.Volume == volume {
			delete(e.backoff, k)
		}
	}
}

// IsRunning reports whether any operation on the volume is running.
func (e *Executor) IsRunning(volume cache.UniqueVolumeName) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.perVol[volume] > 0
}

// Wait blocks until every started operation has returned.
func (e *Executor) Wait() { e.wg.Wait() }
