package objectcache

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/nodevol/nodevol/internal/backoff"
)

// Mode is how the cache keeps an object current.
type Mode int

const (
	// ModeWatch watches each held object (a field selector on its name),
	// one watch-list request reading it and then its changes (a list and
	// then a watch where the server does not support that): a change
	// arrives within one event, as with the kubelet's watch-based
	// managers.
	ModeWatch Mode = iota
	// ModeGet reads each held object again every TTL (a GET, or a list
	// for a selecting Ref), for clusters that do not let the node watch
	// (the kubelet's TTL-based "Cache" strategy, but refreshed in the
	// background so that a change is announced).
	ModeGet
)

// DefaultTTL is the refresh period of ModeGet when Config.TTL is unset
// (the kubelet's default TTL for its TTL-based managers).
const DefaultTTL = time.Minute

// ErrNotHeld is wrapped by the error of a Get or List of a Ref no holder
// holds (or that the last holder let go while the call waited).
var ErrNotHeld = errors.New("not held")

// ErrNotAnswered is wrapped by the error of a Peek of a Ref whose first
// read has not answered yet; that answer is announced through OnChange.
var ErrNotAnswered = errors.New("being read from the API server, not answered yet")

// ErrStopped is wrapped by the error of a Get or List waiting for a first
// answer when Run has returned.
var ErrStopped = errors.New("object cache stopped")

// Config configures a Cache.
type Config struct {
	// Client reads the objects. Required.
	Client kubernetes.Interface
	// Clock times the refresh of ModeGet and the retries. Default: the
	// real clock. One with AfterFunc (clock.WithTickerAndDelayedExecution,
	// as the real and fake clocks are) lets a ModeGet entry hold no
	// goroutine while it waits; with any other, each waiting entry holds
	// one.
	Clock clock.WithTicker
	// OnChange is called, from one goroutine of Run and never under a
	// lock of the cache, when what Get or List answers for a held Ref
	// changes after its first answer: an object changed, appeared or
	// went. Calls are coalesced per Ref: a slow OnChange delays other
	// calls, never a watch. Default: none.
	OnChange func(Ref)
	// Mode is how objects are kept current. Default ModeWatch; a kind the
	// node may only GET is read in ModeGet whatever the Mode.
	Mode Mode
	// TTL is the refresh period of ModeGet. Default DefaultTTL.
	TTL time.Duration
	// TTLJitter spreads ModeGet's refreshes: each waits the TTL plus up
	// to this fraction of it more, at random (wait.Jitter), so that the
	// objects of pods started together are not read again together.
	// Default 0: exactly the TTL.
	TTLJitter float64
	// Transform is applied to every object a read gives (a GET, a list's
	// items, a watch's events) before the cache keeps it, to drop what no
	// reader needs: a node's claims and volumes are kept as long as its
	// pods run. It must keep the name, namespace, resourceVersion and
	// what Get's readers read, must not write its argument, and must be
	// idempotent. Default: objects are kept as read.
	Transform func(runtime.Object) runtime.Object
}

// Cache is the node's cache of the API objects its pods read: one entry
// per Ref however many holders hold it, kept current while held and
// dropped with its last holder. Safe for concurrent use.
type Cache struct {
	client kubernetes.Interface
	clock  clock.WithTicker
	mode   Mode
	ttl    time.Duration
	// ttlJitter is Config.TTLJitter.
	ttlJitter float64
	onChange  func(Ref)
	// transform is Config.Transform; nil: none.
	transform func(runtime.Object) runtime.Object
	// retry is the package's retry policy; tests fix its jitter.
	retry backoff.Policy
	queue workqueue.TypedInterface[Ref]
	loops sync.WaitGroup
	// running counts the entries being read (a watch entry's loop runs,
	// a ModeGet entry's next read is set or its read runs), for tests.
	running atomic.Int32
	// noStream: the client or the API server does not support watch-list
	// requests; fresh entries are listed, then watched.
	noStream atomic.Bool

	mu sync.Mutex
	// ctx is Run's context (nil before Run): the loops run under it.
	ctx     context.Context
	stopped chan struct{} // closed when Run returns
	entries map[Ref]*entry
	held    map[string][]Ref
}

// New returns a cache; Run starts reading.
func New(cfg Config) *Cache {
	c := &Cache{
		client:    cfg.Client,
		clock:     cfg.Clock,
		mode:      cfg.Mode,
		ttl:       cfg.TTL,
		ttlJitter: cfg.TTLJitter,
		onChange:  cfg.OnChange,
		transform: cfg.Transform,
		retry:     retry,
		queue:     workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[Ref]{}),
		stopped:   make(chan struct{}),
		entries:   map[Ref]*entry{},
		held:      map[string][]Ref{},
	}
	c.noStream.Store(!streamsWith(cfg.Client))
	if c.clock == nil {
		c.clock = clock.RealClock{}
	}
	if c.ttl <= 0 {
		c.ttl = DefaultTTL
	}
	return c
}

// Run reads the held objects and delivers OnChange until ctx ends, then
// stops every read and returns when they and the OnChange calls have
// ended. Call it once. Refs held before Run are read once it starts.
func (c *Cache) Run(ctx context.Context) {
	c.mu.Lock()
	c.ctx = ctx
	for _, e := range c.entries {
		c.startLocked(e)
	}
	c.mu.Unlock()
	var worker sync.WaitGroup
	worker.Go(func() {
		for c.deliver() {
		}
	})
	<-ctx.Done()
	c.mu.Lock()
	close(c.stopped)
	for _, e := range c.entries {
		if e.stop != nil {
			e.stop() // a ModeGet entry's timer is no child of ctx
		}
	}
	c.mu.Unlock()
	c.loops.Wait()
	c.queue.ShutDown()
	worker.Wait()
}

// deliver calls OnChange for one changed Ref; false when the queue has
// shut down.
func (c *Cache) deliver() bool {
	r, shutdown := c.queue.Get()
	if shutdown {
		return false
	}
	defer c.queue.Done(r)
	c.mu.Lock()
	_, held := c.entries[r]
	c.mu.Unlock()
	if held { // a read that ended as its last holder let go may still announce
		c.onChange(r)
	}
	return true
}

// Hold makes refs what holder (a pod UID, say) holds, replacing what it
// held before: a Ref newly held by anyone starts being read, one no holder
// holds any more is dropped and its read stopped. Hold with no refs is
// Release. It never blocks on the API server: Get waits for the first
// answer.
func (c *Cache) Hold(holder string, refs ...Ref) {
	refs = slices.Clone(refs)
	slices.SortFunc(refs, compareRefs)
	refs = slices.Compact(refs)
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.held[holder]
	for _, r := range refs {
		if _, had := slices.BinarySearchFunc(old, r, compareRefs); !had {
			c.addLocked(r, holder)
		}
	}
	for _, r := range old {
		if _, keeps := slices.BinarySearchFunc(refs, r, compareRefs); !keeps {
			c.dropLocked(r, holder)
		}
	}
	if len(refs) == 0 {
		delete(c.held, holder)
		return
	}
	c.held[holder] = slices.Clip(refs)
}

// Release lets go of everything holder holds.
func (c *Cache) Release(holder string) { c.Hold(holder) }

// Holders returns the holders that hold r, sorted (for OnChange: the pods
// whose volumes read it). It costs the number of r's holders, not of all
// holders: the volume manager asks it for each claim and volume read.
func (c *Cache) Holders(r Ref) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[r]; e != nil {
		return slices.Clone(e.holders)
	}
	return nil
}

// Get returns the object a named Ref holds, from the cache, waiting
// (bounded by ctx) for the first answer of its read. The object is the
// cache's own: read it, never change it. Errors: apierrors.IsNotFound
// when the object does not exist; the read's error (apierrors.IsForbidden
// for a read the node may not make, one wrapping ErrNotServed, not
// NotFound, when the API server does not serve the kind's API, ...) while
// no read has answered with the object; ErrNotHeld, ErrStopped, or ctx's
// error. After a good answer
// a failing read does not hide the last known object.
func (c *Cache) Get(ctx context.Context, r Ref) (runtime.Object, error) {
	if r.Name == "" {
		return nil, fmt.Errorf("getting %s: %w: Get takes a named reference, List a selecting one", r, errInvalidRef)
	}
	objs, e, err := c.wait(ctx, r)
	if err != nil {
		return nil, err
	}
	if len(objs) == 0 {
		return nil, apierrors.NewNotFound(e.kind.resource, r.Name)
	}
	return objs[0], nil
}

// Peek is Get without the wait, for a reader that must not block (the
// volume manager's loop): before the first answer of r's read it returns
// an error wrapping ErrNotAnswered, and that answer is then announced
// through OnChange like a change (so are the errors that follow while no
// object is had). Otherwise it answers as Get.
func (c *Cache) Peek(r Ref) (runtime.Object, error) {
	if r.Name == "" {
		return nil, fmt.Errorf("peeking %s: %w: Peek takes a named reference", r, errInvalidRef)
	}
	c.mu.Lock()
	e := c.entries[r]
	c.mu.Unlock()
	if e == nil {
		return nil, fmt.Errorf("reading %s: %w", r, ErrNotHeld)
	}
	objs, err := e.peek()
	switch {
	case err != nil:
		return nil, fmt.Errorf("reading %s: %w", r, err)
	case len(objs) == 0:
		return nil, apierrors.NewNotFound(e.kind.resource, r.Name)
	}
	return objs[0], nil
}

// List returns the objects a Ref holds (for a named Ref none or one), as
// Get does, sorted by name; none is not an error. The objects are the
// cache's own: read them, never change them.
func (c *Cache) List(ctx context.Context, r Ref) ([]runtime.Object, error) {
	objs, _, err := c.wait(ctx, r)
	return slices.Clone(objs), err
}

// wait waits for the first answer of r's entry and returns it.
func (c *Cache) wait(ctx context.Context, r Ref) ([]runtime.Object, *entry, error) {
	c.mu.Lock()
	e := c.entries[r]
	c.mu.Unlock()
	if e == nil {
		return nil, nil, fmt.Errorf("reading %s: %w", r, ErrNotHeld)
	}
	select {
	case <-e.answered:
	case <-e.dropped:
		return nil, nil, fmt.Errorf("reading %s: %w", r, ErrNotHeld)
	case <-c.stopped:
		return nil, nil, fmt.Errorf("reading %s: %w", r, ErrStopped)
	case <-ctx.Done():
		return nil, nil, fmt.Errorf("waiting for the first read of %s: %w", r, ctx.Err())
	}
	objs, err := e.answer()
	if err != nil {
		return nil, nil, fmt.Errorf("reading %s: %w", r, err)
	}
	return objs, e, nil
}

// addLocked adds holder to r's holders, making r's entry, and starting
// its reads, if it had none. A new holder of an entry read on cue whose
// last read is a TTL old reads it again: it gets the object no staler
// than a TTL's refresh would, as a pod new to the kubelet reads its
// claim's volume afresh, and the pods that come together (those of one
// shared claim) share one read.
func (c *Cache) addLocked(r Ref, holder string) {
	e := c.entries[r]
	if e == nil {
		e = newEntry(r)
		c.entries[r] = e
		c.startLocked(e)
	}
	if i, ok := slices.BinarySearch(e.holders, holder); !ok {
		e.holders = slices.Insert(e.holders, i, holder)
		if len(e.holders) > 1 && c.staleLocked(e) { // held before: its reads run
			c.cueLocked(e)
		}
	}
}

// dropLocked removes holder from r's holders, and drops r's entry,
// stopping its reads, when it was the last.
func (c *Cache) dropLocked(r Ref, holder string) {
	e := c.entries[r]
	if e == nil {
		return
	}
	if i, ok := slices.BinarySearch(e.holders, holder); ok {
		e.holders = slices.Delete(e.holders, i, i+1)
	}
	if len(e.holders) > 0 {
		return
	}
	delete(c.entries, r)
	close(e.dropped)
	if e.stop != nil {
		e.stop()
	}
}

// startLocked starts an entry's reads once Run has started and until it
// has ended: a watch entry's loop, or a ModeGet entry's first read (see
// getloop.go: it holds no goroutine between reads).
func (c *Cache) startLocked(e *entry) {
	if c.ctx == nil || e.invalid || e.stop != nil || isClosed(c.stopped) {
		return
	}
	if c.modeOf(e) == ModeGet {
		c.startGetLocked(e)
		return
	}
	ctx, cancel := context.WithCancel(c.ctx)
	e.stop = cancel
	c.running.Add(1)
	c.loops.Go(func() {
		defer c.running.Add(-1)
		defer cancel()
		c.watchLoop(ctx, e)
	})
}

func (c *Cache) modeOf(e *entry) Mode {
	if e.kind.getOnly {
		return ModeGet
	}
	return c.mode
}

// changed queues OnChange for an entry whose answer changed.
func (c *Cache) changed(e *entry, changed bool) {
	if changed && c.onChange != nil {
		c.queue.Add(e.ref)
	}
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func compareRefs(a, b Ref) int {
	for _, p := range [...][2]string{
		{string(a.Kind), string(b.Kind)}, {a.Namespace, b.Namespace}, {a.Name, b.Name},
		{a.Fields, b.Fields}, {a.Labels, b.Labels},
	} {
		if p[0] != p[1] {
			if p[0] < p[1] {
				return -1
			}
			return 1
		}
	}
	return 0
}
