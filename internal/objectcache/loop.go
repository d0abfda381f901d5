package objectcache

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/nodevol/nodevol/internal/backoff"
)

// retry is the backoff of a failed read: 500 ms doubling to 1 min, with
// the jitter of API server retries (the kubelet's reflectors: 800 ms to
// 30 s, jittered).
var retry = backoff.Policy{Initial: 500 * time.Millisecond, Max: time.Minute, Jitter: backoff.APIJitter}

const (
	// minWatchTimeout: a watch asks the API server to end it after 30 to
	// 60 minutes (random, so that a node's watches do not all end at
	// once), as the kubelet's object reflectors do; it is then resumed
	// from its last resource version.
	minWatchTimeout = 30 * time.Minute
	// shortWatch: a watch that ends with no event sooner than this is a
	// failure (backed off), so that a server that closes watches at once
	// is not asked again in a tight loop (the reflector's rule).
	shortWatch = time.Second
)

var (
	errShortWatch   = errors.New("the watch ended at once with no event")
	errNoInitialEnd = errors.New("the watch-list request ended before its initial events did")
)

// watchLoop keeps an entry current through a watch of the objects it
// holds (one object: a field selector on its name), until ctx ends or the
// object is immutable. The first read, and every one after the server has
// compacted the watch's version away, is one watch-list request (a watch
// that streams the initial state first) or, where the server or client
// does not support that, a list and then a watch. A failed read is
// retried with backoff; a watch resumes from the last resource version it
// saw.
func (c *Cache) watchLoop(ctx context.Context, e *entry) {
	rv := ""
	failures := 0
	for {
		if failures > 0 && !c.sleep(ctx, c.retry.Delay(failures)) {
			return
		}
		fresh := rv == ""
		stream := fresh && c.streams()
		if fresh && !stream {
			var objs []runtime.Object
			var listRV string
			var err error
			shallow(func() { objs, listRV, err = c.list(ctx, e, false) })
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				logger(ctx, e).Info("Listing failed", "err", err)
				c.changed(e, e.fail(err))
				failures++
				continue
			}
			c.changed(e, e.replace(objs))
			if e.immutableNow() {
				logger(ctx, e).Info("Object is immutable, not watched")
				return
			}
			rv = listRV
		}
		next, progress, done, err := c.watchOnce(ctx, e, rv, stream)
		if done {
			if ctx.Err() == nil {
				logger(ctx, e).Info("Object is immutable, not watched")
			}
			return
		}
		rv = next
		switch {
		case errors.Is(err, errNoWatchList):
			continue // lists at once
		case err != nil:
			logger(ctx, e).Info("Watch ended", "err", err)
			c.changed(e, e.fail(err))
		}
		// A resumed watch whose version is gone reads again at once
		// (events may have been missed); a fresh read's watch that is
		// gone at once is a failure, not a loop.
		if progress || (rv == "" && !fresh) {
			failures = 0
		} else {
			failures++
		}
	}
}

// watchOnce watches an entry from rv until the watch ends; stream makes
// it a watch-list request (rv is then ""), whose initial events replace
// what the entry holds. It returns the resource version to resume from
// ("" to read afresh), whether the watch made progress (an event after
// the initial ones, or it lasted shortWatch), done when ctx ended or the
// object turned immutable, and the error it ended with (errNoWatchList
// when the server does not support watch-list requests).
func (c *Cache) watchOnce(ctx context.Context, e *entry, rv string, stream bool) (next string, progress, done bool, err error) {
	opts := e.m.listOptions(e.ref)
	opts.ResourceVersion = rv
	opts.AllowWatchBookmarks = true
	var initial *initialEvents
	if stream {
		opts.SendInitialEvents = ptr.To(true)
		opts.ResourceVersionMatch = metav1.ResourceVersionMatchNotOlderThan
		initial = &initialEvents{}
	}
	timeout := int64((minWatchTimeout + rand.N(minWatchTimeout)).Seconds())
	opts.TimeoutSeconds = &timeout
	start := c.clock.Now()
	var w watch.Interface
	shallow(func() { w, err = e.kind.watch(ctx, c.client, e.ref.Namespace, opts) })
	if err != nil {
		err = e.kind.served(e.ref.Kind, err)
		if stream && refusesWatchList(err) {
			return "", false, false, c.noWatchList(ctx, e, err)
		}
		return resumeFrom(rv, err), false, ctx.Err() != nil, err
	}
	defer w.Stop()
	events := 0
	for {
		select {
		case <-ctx.Done():
			return rv, true, true, nil
		case ev, ok := <-w.ResultChan():
			switch {
			case !ok && events == 0 && c.clock.Since(start) < shortWatch:
				return rv, false, false, errShortWatch
			case !ok && initial != nil:
				return "", false, false, errNoInitialEnd
			case !ok:
				return rv, true, false, nil
			case ev.Type == watch.Error:
				err := apierrors.FromObject(ev.Object)
				return resumeFrom(rv, err), events > 0 && initial == nil, false, err
			}
			events++
			ev.Object = c.keep(ev.Object)
			if initial != nil {
				ended, err := initial.add(ev)
				if err != nil {
					return "", false, false, c.noWatchList(ctx, e, err)
				}
				if !ended {
					continue
				}
				c.changed(e, e.replace(initial.objs))
				initial = nil
			} else {
				c.apply(e, ev)
			}
			if v := resourceVersion(ev.Object); v != "" {
				rv = v
			}
			if e.immutableNow() {
				return rv, true, true, nil
			}
		}
	}
}

// apply applies one event of a watch to an entry.
func (c *Cache) apply(e *entry, ev watch.Event) {
	switch ev.Type {
	case watch.Added, watch.Modified:
		c.changed(e, e.upsert(ev.Object))
	case watch.Deleted:
		c.changed(e, e.remove(ev.Object))
	}
}

// resumeFrom is where a watch that failed with err resumes: a version the
// server no longer has means listing again.
func resumeFrom(rv string, err error) string {
	if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
		return ""
	}
	return rv
}

// list reads what an entry holds: in Get mode a named ref is a GET (a
// NotFound is no object, unless the API is not served: see served), else
// a list with the ref's selectors. cached lets the API server answer from
// its cache.
func (c *Cache) list(ctx context.Context, e *entry, cached bool) ([]runtime.Object, string, error) {
	if e.m.name != "" && c.modeOf(e) == ModeGet {
		opts := metav1.GetOptions{}
		if cached {
			opts.ResourceVersion = "0"
		}
		obj, err := e.kind.get(ctx, c.client, e.ref.Namespace, e.m.name, opts)
		err = e.kind.served(e.ref.Kind, err)
		if apierrors.IsNotFound(err) {
			return nil, "", nil
		}
		if err != nil {
			return nil, "", err
		}
		return []runtime.Object{c.keep(obj)}, "", nil
	}
	opts := e.m.listOptions(e.ref)
	if cached {
		opts.ResourceVersion = "0"
	}
	l, err := e.kind.list(ctx, c.client, e.ref.Namespace, opts)
	if err != nil {
		return nil, "", e.kind.served(e.ref.Kind, err)
	}
	objs, rv, err := items(l)
	for i := range objs {
		objs[i] = c.keep(objs[i])
	}
	return objs, rv, err
}

// keep is what the cache keeps of an object a read gave: Config.Transform
// of it, or the object itself.
func (c *Cache) keep(obj runtime.Object) runtime.Object {
	if c.transform == nil || obj == nil {
		return obj
	}
	return c.transform(obj)
}

// sleep waits d on the cache's clock; false when ctx ended first.
func (c *Cache) sleep(ctx context.Context, d time.Duration) bool {
	t := c.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}

// shallow runs f, an API call, on a goroutine of its own and waits for
// it: the deep stack of the call grows that goroutine's stack, not the
// watch loop's, which lives as long as the entry (Go shrinks a parked
// goroutine's stack only when three quarters of it are unused). This
// halves the stack a watched entry keeps (TestEntryBytes). A ModeGet
// entry's read needs none: its goroutine ends with the read.
func shallow(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	<-done
}

// logger is the V(4) logger of an entry's loop, made when it logs (an
// entry lives long and logs seldom).
func logger(ctx context.Context, e *entry) klog.Logger {
	return klog.FromContext(ctx).V(4).WithValues("ref", e.ref.String())
}
