package pluginmanager

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/internal/backoff"
	"github.com/nodevol/nodevol/internal/duequeue"
	"github.com/nodevol/nodevol/internal/promreg"
)

// PluginInfo describes a registered plugin.
type PluginInfo struct {
	// SocketPath is the registrar's socket in the registration directory.
	SocketPath string
	// Type, Name, Endpoint and Versions are the registrar's GetInfo
	// answer; Endpoint defaults to SocketPath when the answer has none.
	Type, Name, Endpoint string
	Versions             []string
	// RegisteredAt is when the registration completed.
	RegisteredAt time.Time
}

// Manager watches a plugin registration directory and registers the
// plugins whose registrars appear there. Create it with New and start it
// with Run.
type Manager struct {
	opts Options
	// policy is the retry backoff of a socket: no jitter, as registrations
	// are retried against the registrar's local socket.
	policy  backoff.Policy
	started atomic.Bool

	mu         sync.RWMutex
	registered map[string]PluginInfo // by socket path; a copy of actual
	sockets    map[string]struct{}   // a copy of desired's keys, for the metrics

	// Owned by the Run loop.
	watcher  *fsnotify.Watcher
	desired  map[string]*desiredPlugin
	actual   map[string]*actualPlugin
	backoffs map[string]*retry
	running  map[string]*operation
	// exited is closed when the last goroutine started for a socket has
	// finished, including telling the registrar: the next one waits for
	// it, so that a registrar hears its results in order.
	exited  map[string]chan struct{}
	dirty   map[string]struct{}
	nextGen uint64
	results chan outcome
	wg      sync.WaitGroup
	// retries holds when each backoff in backoffs ends (its until), and
	// wakes the loop at the earliest.
	retries *duequeue.Queue[string]
}

// operation is a registration or deregistration in flight.
type operation struct {
	dereg  bool
	gen    uint64
	cancel context.CancelFunc
}

// outcome is what an operation returns to the loop.
type outcome struct {
	path  string
	dereg bool
	gen   uint64
	// plugin is the registered plugin after a successful registration.
	plugin *actualPlugin
	err    error
	// then, if set, runs after the loop has applied the outcome: telling
	// the registrar, so that it hears "registered" only once Plugins()
	// lists the plugin.
	then func()
	// applied is closed by apply once the outcome is recorded; the
	// operation's goroutine waits for it before running then.
	applied chan struct{}
}

// New returns a manager for opts, with the defaults filled in (see
// Options). It does no I/O.
func New(opts Options) (*Manager, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	m := &Manager{
		opts:       opts,
		policy:     backoff.Policy{Initial: opts.InitialBackoff, Max: opts.MaxBackoff},
		retries:    duequeue.New[string](opts.Clock),
		registered: map[string]PluginInfo{},
		sockets:    map[string]struct{}{},
		desired:    map[string]*desiredPlugin{},
		actual:     map[string]*actualPlugin{},
		backoffs:   map[string]*retry{},
		running:    map[string]*operation{},
		exited:     map[string]chan struct{}{},
		dirty:      map[string]struct{}{},
		results:    make(chan outcome),
	}
	if opts.Registerer != nil {
		// Another manager's collector may be there already (several
		// managers on one registerer): both are collected.
		if err := promreg.Fan(opts.Registerer, newTotalPluginsCollector(m)); err != nil {
			return nil, fmt.Errorf("pluginmanager: registering metrics: %w", err)
		}
	}
	return m, nil
}

// Plugins returns the registered plugins, sorted by socket path.
func (m *Manager) Plugins() []PluginInfo {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]PluginInfo, 0, len(m.registered))
	for _, p := range m.registered {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b PluginInfo) int { return strings.Compare(a.SocketPath, b.SocketPath) })
	return out
}

// Run creates the registration directory if missing, watches it, registers
// the plugins found there and keeps doing so until ctx ends. It returns
// ctx's error after every running registration has finished (they are
// cancelled), or an error if the directory cannot be watched. Run may be
// called once.
func (m *Manager) Run(ctx context.Context) error {
	if !m.started.CompareAndSwap(false, true) {
		return errors.New("pluginmanager: Run called twice")
	}
	logger := klog.FromContext(ctx).WithName("pluginmanager").WithValues("dir", m.opts.Dir)
	ctx = klog.NewContext(ctx, logger)
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	m.watcher = w
	defer w.Close()
	if err := m.rescan(ctx); err != nil {
		return err
	}
	logger.V(2).Info("Watching plugin registration directory")
	resync := m.opts.Clock.NewTicker(m.opts.ResyncPeriod)
	defer resync.Stop()
	defer m.retries.Stop()
	for {
		m.process(ctx)
		select {
		case <-ctx.Done():
			m.drain(ctx)
			return ctx.Err()
		case ev := <-w.Events:
			m.handleEvent(ctx, ev)
		case err := <-w.Errors:
			logger.Error(err, "Watching plugin registration directory failed, rescanning")
			m.rescanLogged(ctx)
		case out := <-m.results:
			m.apply(ctx, out)
		case <-m.retries.C():
			m.retries.Fired() // process marks the backoffs due
		case <-resync.C():
			m.rescanLogged(ctx)
		}
	}
}

// drain waits for the running operations (already cancelled through the
// context) and applies their outcomes, which lets their goroutines finish
// (they wait for their outcome to be applied).
func (m *Manager) drain(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		m.wg.Wait()
		close(done)
	}()
	for {
		select {
		case out := <-m.results:
			m.apply(ctx, out)
		case <-done:
			return
		}
	}
}

// process plans every dirty socket, starts the operations due and arms the
// timer for the earliest backoff.
func (m *Manager) process(ctx context.Context) {
	m.markBackoffsDue()
	now := m.opts.Clock.Now()
	for path := range m.dirty {
		delete(m.dirty, path)
		d, a := m.desired[path], m.actual[path]
		if op := m.running[path]; op != nil {
			if !op.dereg && (d == nil || d.gen != op.gen) {
				op.cancel() // the socket went or was replaced: stop registering it
			}
			continue
		}
		b := m.backoffs[path]
		if b != nil && !b.applies(d, a) {
			m.forgetBackoff(path) // for a generation that is gone
			b = nil
		}
		s, _ := plan(d, a, b, now)
		if s == stepNone && d == nil && a == nil {
			delete(m.exited, path) // forgotten socket
		}
		switch s {
		case stepRegister:
			m.start(ctx, path, false, d.gen, func(ctx context.Context) outcome { return m.register(ctx, path, d.gen) })
		case stepDeregister:
			m.start(ctx, path, true, a.gen, func(ctx context.Context) outcome { return m.deregister(ctx, path, a) })
		}
	}
	m.retries.Arm()
}

// start runs op in a goroutine; its outcome comes back on m.results. The
// goroutine runs the outcome's then only after the loop (or drain, when
// stopping) has applied the outcome, and closes exited only after that, so
// that the next operation on the socket starts after then has run.
func (m *Manager) start(ctx context.Context, path string, dereg bool, gen uint64, op func(context.Context) outcome) {
	opCtx, cancel := context.WithCancel(ctx)
	m.running[path] = &operation{dereg: dereg, gen: gen, cancel: cancel}
	prev, exited := m.exited[path], make(chan struct{})
	m.exited[path] = exited
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer close(exited)
		defer cancel()
		if prev != nil {
			<-prev
		}
		out := op(opCtx)
		then := out.then
		out.then = nil
		applied := make(chan struct{})
		out.applied = applied
		// Every outcome sent is received and applied, by Run's loop or
		// by drain: neither waits on this goroutine meanwhile.
		m.results <- out
		<-applied
		if then != nil {
			then()
		}
	}()
}

// apply records an operation's outcome: the single writer of m.actual.
// It closes out.applied when done (after m.mu is released: Plugins() then
// shows the outcome).
func (m *Manager) apply(ctx context.Context, out outcome) {
	if out.applied != nil {
		defer close(out.applied)
	}
	logger := klog.FromContext(ctx)
	delete(m.running, out.path)
	m.dirty[out.path] = struct{}{}
	if out.err != nil {
		b := m.backoffs[out.path]
		if b == nil || b.gen != out.gen || b.dereg != out.dereg {
			b = &retry{dereg: out.dereg, gen: out.gen}
			m.backoffs[out.path] = b
		}
		b.failures++
		wait := m.policy.Delay(b.failures)
		b.until = m.opts.Clock.Now().Add(wait)
		m.retries.Set(out.path, b.until)
		what := "Plugin registration failed, will retry"
		if out.dereg {
			what = "Plugin deregistration failed, will retry"
		}
		if ctx.Err() == nil {
			logger.Error(out.err, what, "socketPath", out.path, "failures", b.failures, "retryAfter", wait)
		}
		return
	}
	m.forgetBackoff(out.path)
	m.mu.Lock()
	defer m.mu.Unlock()
	if out.dereg {
		delete(m.actual, out.path)
		delete(m.registered, out.path)
		return
	}
	m.actual[out.path] = out.plugin
	m.registered[out.path] = out.plugin.info
}

// markBackoffsDue marks the sockets whose backoff has expired dirty.
func (m *Manager) markBackoffsDue() {
	for _, path := range m.retries.PopDue() {
		if m.running[path] == nil {
			m.dirty[path] = struct{}{}
		}
	}
}

// forgetBackoff drops the backoff of path.
func (m *Manager) forgetBackoff(path string) {
	delete(m.backoffs, path)
	m.retries.Remove(path)
}
