package objectcache

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/clock"
	testingclock "k8s.io/utils/clock/testing"
)

// timerOnly hides the fake clock's AfterFunc: the cache then waits on a
// timer of its own (Config.Clock is only a clock.WithTicker).
type timerOnly struct{ clock.WithTicker }

// script makes the GETs of a resource fail with the errors it is given,
// one per GET, in order (nil: the GET succeeds); a failed GET is counted
// in a.gets as the others are.
type script struct {
	mu   sync.Mutex
	errs []error
}

func newScript(a *api, resource string) *script {
	s := &script{}
	a.PrependReactor("get", resource, func(action k8stesting.Action) (bool, runtime.Object, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.errs) == 0 {
			return false, nil, nil
		}
		err := s.errs[0]
		s.errs = s.errs[1:]
		if err != nil {
			a.mu.Lock()
			a.gets = append(a.gets, action.(k8stesting.GetActionImpl).GetOptions)
			a.mu.Unlock()
		}
		return err != nil, nil, err
	})
	return s
}

func (s *script) then(errs ...error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.errs = append(s.errs, errs...)
}

// readStep is one wait of a get entry: the next read comes after exactly
// after on the clock (none a nanosecond sooner); before it, prepare runs.
type readStep struct {
	name    string
	prepare func(*testing.T, *api, *script)
	after   time.Duration
	// cached: the read may be served from the API server's cache.
	cached bool
}

var refused = apierrors.NewForbidden(corev1.Resource("persistentvolumeclaims"), "c", errors.New("no relationship found"))

// TestGetScheduleTiming: the reads of a ModeGet entry on the clock, with
// a clock that has AfterFunc and one that has not: the first read at
// once; a failed read retried after the backoff (doubling while reads
// fail, and from its start again once one succeeds); a good read's next
// after the TTL, served from the API server's cache; a VolumeAttachment
// not attached yet read after 1 s, 1.5 s, 2.25 s, and every TTL once
// attached.
func TestGetScheduleTiming(t *testing.T) {
	const ttl = time.Minute
	fail := func(n int) func(*testing.T, *api, *script) {
		return func(_ *testing.T, _ *api, s *script) {
			for range n {
				s.then(refused)
			}
		}
	}
	attach := func(t *testing.T, a *api, _ *script) {
		va := &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "va"}, Status: storagev1.VolumeAttachmentStatus{Attached: true}}
		if err := a.Tracker().Update(storagev1.SchemeGroupVersion.WithResource("volumeattachments"), va, ""); err != nil {
			t.Fatal(err)
		}
	}
	scenarios := []struct {
		name     string
		ref      Ref
		resource string
		first    func(*testing.T, *api, *script)
		steps    []readStep
	}{
		{"claim: backoff and TTL", pvcRef, "persistentvolumeclaims", fail(2), []readStep{
			{name: "first retry", after: retry.Initial},
			{name: "second retry, doubled", after: 2 * retry.Initial},
			{name: "refresh after the TTL", after: ttl, cached: true, prepare: fail(1)},
			{name: "retry from the first backoff again", after: retry.Initial},
			{name: "refresh", after: ttl, cached: true},
		}},
		{"attachment: quick polls", vaRef, "volumeattachments", nil, []readStep{
			{name: "first poll", after: pollFirst, cached: true},
			{name: "second poll", after: pollFirst * 3 / 2, cached: true, prepare: fail(1)},
			{name: "retry", after: retry.Initial},
			{name: "third poll", after: pollFirst * 9 / 4, cached: true, prepare: attach},
			{name: "attached: the TTL", after: ttl, cached: true},
		}},
	}
	clocks := []struct {
		name string
		wrap func(*testingclock.FakeClock) clock.WithTicker
	}{
		{"AfterFunc", func(fc *testingclock.FakeClock) clock.WithTicker { return fc }},
		{"timer only", func(fc *testingclock.FakeClock) clock.WithTicker { return timerOnly{fc} }},
	}
	for _, ck := range clocks {
		for _, sc := range scenarios {
			t.Run(ck.name+"/"+sc.name, func(t *testing.T) {
				a := newAPI(claim(""), &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "va"}})
				s := newScript(a, sc.resource)
				if sc.first != nil {
					sc.first(t, a, s)
				}
				fc := newFakeClock()
				c, _ := start(t, a, Config{Clock: ck.wrap(fc), TTL: ttl})
				c.Hold("pod", sc.ref)
				if gets := waitGets(t, a, fc); gets != 1 {
					t.Fatalf("%d GETs at first, want 1", gets)
				}
				for i, st := range sc.steps {
					if st.prepare != nil {
						st.prepare(t, a, s)
					}
					fc.Step(st.after - time.Nanosecond)
					// A timer that fires leaves the fake clock in Step:
					// one still there has not.
					if w := fc.Waiters(); w != 1 {
						t.Fatalf("%s: %d timers a nanosecond before the read, want the one not fired", st.name, w)
					}
					fc.Step(time.Nanosecond)
					if gets := waitGets(t, a, fc); gets != i+2 {
						t.Fatalf("%s: %d GETs, want %d", st.name, gets, i+2)
					}
					a.mu.Lock()
					rv := a.gets[i+1].ResourceVersion
					a.mu.Unlock()
					if want := map[bool]string{true: "0"}[st.cached]; rv != want {
						t.Errorf("%s: GET with resourceVersion %q, want %q", st.name, rv, want)
					}
				}
				c.Release("pod")
				eventually(t, "the reads stopped", func() bool { return c.running.Load() == 0 })
				eventually(t, "the timer stopped", func() bool { return !fc.HasWaiters() })
			})
		}
	}
}

// handClock is a fake clock whose AfterFunc timers fire when the test
// fires them, however often, even after Stop (which reports them fired):
// a timer that fires as the entry is dropped, or twice.
type handClock struct {
	*testingclock.FakeClock
	mu  sync.Mutex
	fns []func()
}

func (h *handClock) AfterFunc(_ time.Duration, f func()) clock.Timer {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.fns = append(h.fns, f)
	return firedTimer{}
}

// timers returns the number of timers set so far.
func (h *handClock) timers() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.fns)
}

// fire fires timer i (0: the first set).
func (h *handClock) fire(i int) {
	h.mu.Lock()
	f := h.fns[i]
	h.mu.Unlock()
	f()
}

// firedTimer is a timer that has fired: Stop stops nothing.
type firedTimer struct{}

func (firedTimer) C() <-chan time.Time      { return nil }
func (firedTimer) Stop() bool               { return false }
func (firedTimer) Reset(time.Duration) bool { return false }

// runCache runs a cache on a until cancel is called (or the test ends);
// done is closed when Run has returned.
func runCache(t *testing.T, a *api, cfg Config) (c *Cache, changes <-chan Ref, cancel context.CancelFunc, done <-chan struct{}) {
	t.Helper()
	ch := make(chan Ref, 100)
	cfg.Client = a
	cfg.OnChange = func(r Ref) { ch <- r }
	c, cancel, done = runOn(t, cfg)
	return c, ch, cancel, done
}

// TestGetTimerFiresLate: a timer that fires after its entry was dropped,
// or after its wait is over (a later read started), or twice, starts no
// read: only a wait's first firing while the entry is held does. Run's
// end waits for every read started, so the GETs counted then are all.
func TestGetTimerFiresLate(t *testing.T) {
	a := newAPI(claim(""))
	hc := &handClock{FakeClock: newFakeClock()}
	c, _, cancel, done := runCache(t, a, Config{Clock: hc, TTL: time.Minute})
	other := Ref{Kind: PersistentVolume, Name: "pv"}
	c.Hold("pod", pvcRef)
	eventually(t, "the first read's timer", func() bool { return hc.timers() == 1 })
	hc.fire(0)
	eventually(t, "the second read's timer", func() bool { return hc.timers() == 2 })
	hc.fire(0) // its wait is over: the second read started and ended
	hc.fire(1)
	hc.fire(1) // twice: the third read runs once
	eventually(t, "the third read's timer", func() bool { return hc.timers() == 3 })
	c.Hold("pod", other) // drops the claim; its timer fires after
	if c.running.Load() != 1 {
		t.Errorf("running %d after the drop, want the volume's reads only", c.running.Load())
	}
	hc.fire(2)
	eventually(t, "the volume's timer", func() bool { return hc.timers() == 4 })
	cancel()
	<-done
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.gets) != 4 {
		t.Errorf("%d GETs, want 3 of the claim and 1 of the volume", len(a.gets))
	}
	if c.running.Load() != 0 {
		t.Errorf("running %d after Run returned", c.running.Load())
	}
}

// blockGets blocks the GETs of a resource from the nth on (1: the first)
// until release is closed; reading is closed as the nth arrives.
func blockGets(a *api, resource string, nth int) (reading, release chan struct{}) {
	reading, release = make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	n := 0
	a.PrependReactor("get", resource, func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		n++
		block := n == nth
		mu.Unlock()
		if block {
			close(reading)
			<-release
		}
		return false, nil, nil
	})
	return reading, release
}

// TestGetStopDuringRead: a read that runs as its entry is dropped, or as
// Run ends, is cancelled: what it finds is not kept or announced, no next
// read is set, and Run returns only once it has ended.
func TestGetStopDuringRead(t *testing.T) {
	for _, tt := range []struct {
		name string
		stop func(c *Cache, cancelRun context.CancelFunc)
	}{
		{"dropped", func(c *Cache, _ context.CancelFunc) { c.Release("pod") }},
		{"Run ends", func(_ *Cache, cancelRun context.CancelFunc) { cancelRun() }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := newAPI(claim(""))
			reading, release := blockGets(a, "persistentvolumeclaims", 2)
			fc := newFakeClock()
			c, changes, cancel, done := runCache(t, a, Config{Clock: fc, TTL: time.Minute})
			c.Hold("pod", pvcRef)
			waitGets(t, a, fc)
			if err := a.Tracker().Update(corev1.SchemeGroupVersion.WithResource("persistentvolumeclaims"), claim("pv"), "ns"); err != nil {
				t.Fatal(err)
			}
			fc.Step(time.Minute)
			closed(t, reading, "the second read")
			tt.stop(c, cancel)
			if c.running.Load() != 1 || !notClosed(done) {
				t.Errorf("running %d (Run returned: %v) while the cancelled read runs, want 1, not returned", c.running.Load(), !notClosed(done))
			}
			close(release)
			eventually(t, "the reads ended", func() bool { return c.running.Load() == 0 })
			cancel()
			closed(t, done, "Run's return")
			if fc.HasWaiters() {
				t.Error("a read was set after the cancelled one")
			}
			select {
			case r := <-changes:
				t.Errorf("OnChange(%s) from a cancelled read", r)
			default:
			}
		})
	}
}

// TestGetScheduleRace: many get entries read on a clock stepped from two
// goroutines, with failing reads, while holders come and go: every read
// stops with the last holder and Run (for the race detector, and for no
// read or timer left behind).
func TestGetScheduleRace(t *testing.T) {
	a := newAPI()
	var mu sync.Mutex
	n := 0
	a.PrependReactor("get", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if n++; n%3 == 0 {
			return true, nil, refused
		}
		return false, nil, nil
	})
	fc := newFakeClock()
	c, _, cancel, done := runCache(t, a, Config{Clock: fc, Mode: ModeGet, TTL: time.Second})
	refs := make([]Ref, 20)
	for i := range refs {
		refs[i] = Ref{Kind: ConfigMap, Namespace: "ns", Name: string(rune('a' + i))}
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for range 200 {
				fc.Step(100 * time.Millisecond)
			}
		})
	}
	wg.Go(func() {
		for i := range 200 {
			c.Hold("pod", refs[i%len(refs)], refs[(i*7)%len(refs)])
			c.Hold("pod2", refs[(i*3)%len(refs)])
		}
	})
	wg.Wait()
	c.Release("pod")
	c.Release("pod2")
	eventually(t, "every read stopped", func() bool { return c.running.Load() == 0 })
	cancel()
	<-done
	if fc.HasWaiters() {
		t.Error("a timer left set after every entry was dropped")
	}
}

// TestGetImmutableNoLongerRead: in ModeGet an immutable configMap is read
// once, or up to the read that finds it made immutable, and then has no
// timer and no read; a second holder reads it no more; Get keeps it.
func TestGetImmutableNoLongerRead(t *testing.T) {
	immutable := func(v bool) *corev1.ConfigMap {
		o := configMap("ns", "cm", map[string]string{"k": "v"})
		o.Immutable = &v
		return o
	}
	for _, tt := range []struct {
		name  string
		first *corev1.ConfigMap
		gets  int
	}{
		{"from the start", immutable(true), 1},
		{"made immutable", immutable(false), 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := newAPI(tt.first)
			fc := newFakeClock()
			c, _ := start(t, a, Config{Clock: fc, Mode: ModeGet, TTL: time.Minute})
			c.Hold("pod", cmRef)
			get(t, c, cmRef)
			if tt.gets > 1 {
				waitGets(t, a, fc)
				if err := a.Tracker().Update(corev1.SchemeGroupVersion.WithResource("configmaps"), immutable(true), "ns"); err != nil {
					t.Fatal(err)
				}
				fc.Step(time.Minute)
			}
			eventually(t, "the reads to end", func() bool { return c.running.Load() == 0 })
			c.Hold("pod2", cmRef)
			if fc.HasWaiters() {
				t.Error("a read set for an immutable object")
			}
			if _, _, gets := a.counts(); gets != tt.gets {
				t.Errorf("%d GETs, want %d", gets, tt.gets)
			}
			if dataOf(t, get(t, c, cmRef)) != "v" {
				t.Error("immutable object not kept")
			}
		})
	}
}
