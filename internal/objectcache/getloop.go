package objectcache

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"
)

// A ModeGet entry holds no goroutine between its reads: its next read is a
// timer on the cache's clock, whose callback starts the read on a
// goroutine that ends with it. At thousands of held claims, volumes and
// attachments, a parked loop per entry (a stack of several KiB, a context
// and a timer) was most of the cache's memory and much of its CPU.
//
// An entry's reads are a little state machine under getState.mu:
//
//	reading --read ends--> waiting --timer fires--> reading
//	   |                      |
//	   +--stop, immutable,    +--stop--> ended
//	      ctx ended--> ended
//
// Exactly one party moves an entry out of each state (the read's
// goroutine out of reading, whoever takes the lock first out of waiting),
// so a read never runs twice at once, and a timer that fires after a stop
// (or after a later wait replaced its own) starts nothing. The entry
// holds one count of Cache.loops (and of running) from its start to
// ended; each read's goroutine and each fallback timer goroutine
// (afterFunc) holds one more while it runs, so Run waits for all of them.

// getPhase is where a ModeGet entry's reads stand.
type getPhase uint8

const (
	// getWaiting: the next read is a timer on the clock (or, at the
	// start, about to begin).
	getWaiting getPhase = iota
	// getReading: a read runs on its own goroutine.
	getReading
	// getEnded: no read runs or will: the entry was dropped, the cache
	// stopped, or the object is immutable.
	getEnded
)

// getState is the schedule of a ModeGet entry's reads.
type getState struct {
	// parent is Run's context: each read runs under a child of it.
	parent context.Context

	mu    sync.Mutex
	phase getPhase
	// wait numbers the waits: a timer starts a read only while the wait
	// it was set for is the entry's current one.
	wait uint64
	// timer is the current wait's timer, once it is set (nil while
	// reading, and in the instant between a read's end and its timer).
	timer stopper
	// cancel cancels the read running (nil while waiting).
	cancel context.CancelFunc

	// failures and poll are the reads' own: only the read running
	// touches them, and reads follow one another through mu.
	failures int
	// poll is the last quick read's delay (see nextPoll); 0: none.
	poll time.Duration
	// readAt is when the last good read began (zero before one).
	readAt time.Time
	// cued: the entry was cued while a read ran, which may have read
	// the object before the change the cue is for: it is read again at
	// once when that read ends. Under mu.
	cued bool
}

// untilCued is readOnce's delay for an entry that waits, with no timer,
// for a cue (kindInfo.onCue).
const untilCued time.Duration = -1

// stopper is a timer as the schedule uses it.
type stopper interface{ Stop() bool }

// startGetLocked starts a ModeGet entry's reads, the first at once.
func (c *Cache) startGetLocked(e *entry) {
	e.get = &getState{parent: c.ctx}
	e.stop = func() { c.stopGet(e) }
	c.running.Add(1)
	c.loops.Add(1)
	c.fire(e, 0)
}

// fire starts the read that ends wait n of a ModeGet entry, unless that
// wait is over (the entry stopped, or another read started). It runs as a
// timer's callback, which a fake clock calls under its own lock: it must
// not call the clock.
func (c *Cache) fire(e *entry, n uint64) {
	g := e.get
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.phase != getWaiting || g.wait != n {
		return
	}
	ctx, cancel := context.WithCancel(g.parent)
	g.phase, g.timer, g.cancel = getReading, nil, cancel
	c.loops.Add(1) // the entry's own count is held: Run is not done waiting
	go func() {
		defer c.loops.Done()
		c.read(ctx, e)
	}()
}

// read runs one read of a ModeGet entry, on a goroutine of its own (and
// another at once for each cue that came during it), and then sets the
// timer of the next one, or ends the entry's reads.
func (c *Cache) read(ctx context.Context, e *entry) {
	g := e.get
	next, again := c.readOnce(ctx, e)
	g.mu.Lock()
	for again && g.cued && g.phase != getEnded {
		g.cued = false
		g.mu.Unlock()
		next, again = c.readOnce(ctx, e)
		g.mu.Lock()
	}
	cancel := g.cancel
	g.cancel = nil
	if !again || g.phase == getEnded { // immutable, or stopped meanwhile
		g.phase = getEnded
		g.mu.Unlock()
		cancel()
		c.endGet()
		return
	}
	g.phase = getWaiting
	g.wait++
	n := g.wait
	g.mu.Unlock()
	cancel()
	if next == untilCued {
		return // the next read is a cue's (c.cue)
	}
	// The clock is called outside mu (a fake clock calls fire under its
	// lock); the timer may fire, or the entry stop, before it is kept.
	t := c.afterFunc(next, func() { c.fire(e, n) })
	g.mu.Lock()
	if g.phase == getWaiting && g.wait == n {
		g.timer = t
		g.mu.Unlock()
		return
	}
	g.mu.Unlock()
	t.Stop() // stopped before the timer was kept (or fired already)
}

// readOnce reads a ModeGet entry once and records the answer; it returns
// the delay of the next read, or false when there is none (the object is
// immutable, or ctx ended: then the answer is not recorded).
func (c *Cache) readOnce(ctx context.Context, e *entry) (time.Duration, bool) {
	g := e.get
	if ctx.Err() != nil { // stopped as the timer fired
		return 0, false
	}
	// After a good read, the next may be served from the API server's
	// cache (resourceVersion 0), as the kubelet's TTL manager refreshes;
	// not a read on cue: the cache of one kind may lag behind another's
	// (a claim's change seen, its volume's not yet), and a new holder
	// gets the object as it is now.
	had := e.answeredOK()
	cached := had && g.failures == 0 && !e.kind.onCue
	began := c.clock.Now()
	objs, _, err := c.list(ctx, e, cached)
	if ctx.Err() != nil {
		return 0, false
	}
	if err != nil {
		logger(ctx, e).Info("Reading failed", "err", err)
		c.changed(e, e.fail(err))
		g.failures++
		return c.retry.Delay(g.failures), true
	}
	g.failures = 0
	g.mu.Lock()
	g.readAt = began
	g.mu.Unlock()
	changed := e.replace(objs)
	c.changed(e, changed)
	if changed && had && e.kind.cues != nil {
		for _, o := range objs {
			c.cue(e.kind.cues(o)...)
		}
	}
	if e.immutableNow() {
		logger(ctx, e).Info("Object is immutable, no longer read")
		return 0, false
	}
	if e.kind.onCue && e.m.name != "" && len(objs) > 0 {
		return untilCued, true
	}
	g.poll = nextPoll(e, objs, changed, g.poll)
	if g.poll > 0 {
		return min(c.ttl, g.poll), true
	}
	return c.refresh(), true
}

// refresh is the delay of a ModeGet entry's next read after a good one:
// the TTL, plus up to Config.TTLJitter of it more, at random.
func (c *Cache) refresh() time.Duration {
	if c.ttlJitter <= 0 {
		return c.ttl
	}
	return wait.Jitter(c.ttl, c.ttlJitter)
}

// cue reads the held entries of refs that are read on cue
// (kindInfo.onCue) again now, or, where a read runs, once it ends.
func (c *Cache) cue(refs ...Ref) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range refs {
		if e := c.entries[r]; e != nil {
			c.cueLocked(e)
		}
	}
}

// staleLocked reports an entry read on cue whose last good read began a
// TTL ago or more, under the Cache's lock.
func (c *Cache) staleLocked(e *entry) bool {
	g := e.get
	if g == nil || !e.kind.onCue {
		return false
	}
	g.mu.Lock()
	at := g.readAt
	g.mu.Unlock()
	// The clock is called outside g.mu: a fake clock calls fire, which
	// takes it, under its own lock.
	return !at.IsZero() && c.clock.Since(at) >= c.ttl
}

// cueLocked is cue of one entry, under the Cache's lock (which orders
// it after a drop's stop).
func (c *Cache) cueLocked(e *entry) {
	g := e.get
	if g == nil || !e.kind.onCue {
		return
	}
	g.mu.Lock()
	var t stopper
	switch g.phase {
	case getReading:
		g.cued = true
		g.mu.Unlock()
		return
	case getEnded:
		g.mu.Unlock()
		return
	}
	t, g.timer = g.timer, nil
	n := g.wait
	g.mu.Unlock()
	if t != nil {
		t.Stop() // a missing volume's next read: this one replaces it
	}
	c.fire(e, n)
}

// stopGet ends a ModeGet entry's reads: a waiting entry's timer is
// stopped, a running read cancelled (its goroutine ends the entry). No
// read starts after it.
func (c *Cache) stopGet(e *entry) {
	g := e.get
	g.mu.Lock()
	was := g.phase
	t, cancel := g.timer, g.cancel
	g.phase, g.timer = getEnded, nil
	g.mu.Unlock()
	switch was {
	case getWaiting:
		if t != nil {
			t.Stop()
		}
		c.endGet()
	case getReading:
		cancel()
	}
}

// endGet releases the counts a ModeGet entry held while it was read.
func (c *Cache) endGet() {
	c.running.Add(-1)
	c.loops.Done()
}

// afterFunc calls f on a goroutine of its own after d on the cache's
// clock. A clock without AfterFunc (Config.Clock is a clock.WithTicker)
// is given one made of a timer and a goroutine that waits on it, which
// Run waits for; the wait then holds that goroutine.
func (c *Cache) afterFunc(d time.Duration, f func()) stopper {
	if dc, ok := c.clock.(clock.WithDelayedExecution); ok {
		return dc.AfterFunc(d, f)
	}
	t := &timerFunc{t: c.clock.NewTimer(d), stop: make(chan struct{})}
	c.loops.Add(1) // called by a read, whose count is held
	go func() {
		defer c.loops.Done()
		select {
		case <-t.t.C():
			f()
		case <-t.stop:
		}
	}()
	return t
}

// timerFunc is afterFunc's timer on a clock without AfterFunc.
type timerFunc struct {
	t    clock.Timer
	once sync.Once
	stop chan struct{} // closed by Stop: the goroutine waiting ends
}

func (t *timerFunc) Stop() bool {
	stopped := t.t.Stop()
	t.once.Do(func() { close(t.stop) })
	return stopped
}

// nextPoll is the next quick read of an entry whose kind reads some
// objects quickly (kindInfo.quick): pollFirst after a change or the first
// read, then half as long again each time up to pollMax; 0 when the
// object read is not one to read quickly.
func nextPoll(e *entry, objs []runtime.Object, changed bool, last time.Duration) time.Duration {
	if e.kind.quick == nil || e.m.name == "" {
		return 0
	}
	var obj runtime.Object
	if len(objs) > 0 {
		obj = objs[0]
	}
	switch {
	case !e.kind.quick(obj):
		return 0
	case changed || last == 0:
		return pollFirst
	}
	return min(last*3/2, pollMax)
}

// answeredOK reports an entry that has had a good read.
func (e *entry) answeredOK() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.have
}
