package objectcache

import (
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	k8stesting "k8s.io/client-go/testing"
)

// server is how the fake API server of streamAPI answers a watch-list
// request (a watch with sendInitialEvents=true).
type server int

const (
	// streaming: as a 1.37 API server, the objects as ADDED events, then
	// the bookmark that ends the initial events, then the changes.
	streaming server = iota
	// ignoring: a server that ignores sendInitialEvents: a plain watch
	// from "now" (which sends the objects as ADDED events) and, since
	// bookmarks are allowed, a bookmark without the annotation.
	ignoring
	// refusing: a server with its WatchList feature gate off (422).
	refusing
)

// streamAPI is the fake clientset with watches that implement watch-list
// requests as the API server does (the fake's own ignore
// sendInitialEvents, and it says so: see IsWatchListSemanticsUnSupported).
// Every watch is counted in the api's watches, as its list and gets are.
type streamAPI struct {
	*api
	server server
	rv     atomic.Int64
	// streams receives each watch opened, for the test to end it.
	streams chan *stream
	// expire, when set, makes the next plain watch (a resumed one) wait
	// for it to close and then end with 410 Expired.
	mu     sync.Mutex
	expire chan struct{}
}

// IsWatchListSemanticsUnSupported hides the fake clientset's (true): this
// one serves watch-list requests.
func (s *streamAPI) IsWatchListSemanticsUnSupported() bool { return false }

func newStreamAPI(srv server, objs ...runtime.Object) *streamAPI {
	s := &streamAPI{api: newAPI(objs...), server: srv, streams: make(chan *stream, 100)}
	s.PrependWatchReactor("*", func(action k8stesting.Action) (bool, watch.Interface, error) {
		opts := action.(k8stesting.WatchActionImpl).ListOptions
		call := &watchCall{gvr: action.GetResource(), resource: action.GetResource().Resource, ns: action.GetNamespace(), opts: opts, stopped: make(chan struct{})}
		s.api.mu.Lock()
		s.watches = append(s.watches, call)
		s.api.mu.Unlock()
		s.mu.Lock()
		expire := s.expire
		s.mu.Unlock()
		s.opened <- call
		initial := opts.SendInitialEvents != nil && *opts.SendInitialEvents
		switch {
		case initial && srv == refusing:
			return true, nil, apierrors.NewInvalid(schema.GroupKind{Group: metav1.GroupName, Kind: "ListOptions"}, "", field.ErrorList{
				field.Forbidden(field.NewPath("sendInitialEvents"), "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled")})
		case !initial && expire != nil:
			// The fake's lock is held while a reactor runs: the
			// stream waits for expire, not the reactor.
			s.mu.Lock()
			s.expire = nil
			s.mu.Unlock()
			gone := watch.Event{Type: watch.Error, Object: &apierrors.NewResourceExpired("too old resource version").ErrStatus}
			w := newStream(call, watch.NewEmptyWatch(), expire, []watch.Event{gone})
			s.streams <- w
			return true, w, nil
		}
		inner, err := s.Tracker().Watch(call.gvr, call.ns, opts)
		if err != nil {
			return true, nil, err
		}
		var first []watch.Event
		if initial {
			if first, err = s.initialEvents(call); err != nil {
				return true, nil, err
			}
		}
		w := newStream(call, inner, nil, first)
		s.streams <- w
		return true, w, nil
	})
	return s
}

// calls returns the watches opened so far.
func (s *streamAPI) calls() []*watchCall {
	s.api.mu.Lock()
	defer s.api.mu.Unlock()
	return slices.Clone(s.watches)
}

// expireNext makes the next plain watch end with 410 Expired, and
// nothing before it, once release is closed.
func (s *streamAPI) expireNext(release chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire = release
}

// initialEvents are the events a watch-list request starts with: the
// objects (by name when the field selector names one), then the bookmark.
func (s *streamAPI) initialEvents(call *watchCall) ([]watch.Event, error) {
	gvk := call.gvr.GroupVersion().WithKind(string(kindOf[call.gvr.Resource]))
	l, err := s.Tracker().List(call.gvr, gvk, call.ns)
	if err != nil {
		return nil, err
	}
	objs, err := meta.ExtractList(l)
	if err != nil {
		return nil, err
	}
	name := ""
	if sel, err := fields.ParseSelector(call.opts.FieldSelector); err == nil {
		name, _ = sel.RequiresExactMatch("metadata.name")
	}
	var evs []watch.Event
	for _, o := range objs {
		if name == "" || nameOf(o) == name {
			evs = append(evs, watch.Event{Type: watch.Added, Object: o})
		}
	}
	mark, err := scheme.Scheme.New(gvk)
	if err != nil {
		return nil, err
	}
	m, err := meta.Accessor(mark)
	if err != nil {
		return nil, err
	}
	m.SetResourceVersion(strconv.FormatInt(s.rv.Add(1), 10))
	if s.server == streaming {
		m.SetAnnotations(map[string]string{metav1.InitialEventsAnnotationKey: "true"})
	}
	return append(evs, watch.Event{Type: watch.Bookmark, Object: mark}), nil
}

// kindOf is the kind of each resource the cache watches.
var kindOf = map[string]Kind{"configmaps": ConfigMap, "secrets": Secret, "clustertrustbundles": ClusterTrustBundle}

// stream is one watch of streamAPI: once gate is closed (nil: at once),
// its first events, then the tracker's, until the cache stops it or the
// test ends it (as a server does).
type stream struct {
	call *watchCall
	ch   chan watch.Event
	stop chan struct{}
	end  chan struct{}
	once sync.Once
	ends sync.Once
}

func newStream(call *watchCall, inner watch.Interface, gate <-chan struct{}, first []watch.Event) *stream {
	w := &stream{call: call, ch: make(chan watch.Event), stop: make(chan struct{}), end: make(chan struct{})}
	go func() {
		defer close(w.ch)
		defer inner.Stop()
		if gate != nil {
			select {
			case <-gate:
			case <-w.stop:
				return
			}
		}
		for _, ev := range first {
			if !w.send(ev) {
				return
			}
		}
		for {
			select {
			case ev, ok := <-inner.ResultChan():
				if !ok || !w.send(ev) {
					return
				}
			case <-w.stop:
				return
			case <-w.end:
				return
			}
		}
	}()
	return w
}

func (w *stream) send(ev watch.Event) bool {
	select {
	case w.ch <- ev:
		return true
	case <-w.stop:
	case <-w.end:
	}
	return false
}

func (w *stream) ResultChan() <-chan watch.Event { return w.ch }

func (w *stream) Stop() {
	w.once.Do(func() {
		close(w.stop)
		close(w.call.stopped)
	})
}

// close ends the watch as the server does.
func (w *stream) close() { w.ends.Do(func() { close(w.end) }) }
