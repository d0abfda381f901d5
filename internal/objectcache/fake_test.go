package objectcache

import (
	"context"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	testingclock "k8s.io/utils/clock/testing"
)

// api is the fake clientset with a count of what the cache asked of it.
// The fake ignores field selectors (a watch of one configMap sees every
// configMap of its namespace; a list returns them all), so the tests count
// the lists and watches the cache asked for and check the selectors it
// sent, and the cache's own filter keeps the answers right.
type api struct {
	*fake.Clientset
	mu      sync.Mutex
	watches []*watchCall
	lists   []metav1.ListOptions
	gets    []metav1.GetOptions
	// opened receives each watch as it is opened.
	opened chan *watchCall
}

// watchCall is one watch the cache opened.
type watchCall struct {
	gvr      schema.GroupVersionResource
	resource string
	ns       string
	opts     metav1.ListOptions
	// stopped is closed when the cache stops the watch.
	stopped chan struct{}
}

type countedWatch struct {
	watch.Interface
	once sync.Once
	call *watchCall
}

func (w *countedWatch) Stop() {
	w.Interface.Stop()
	w.once.Do(func() { close(w.call.stopped) })
}

func newAPI(objs ...runtime.Object) *api {
	a := &api{Clientset: fake.NewClientset(objs...), opened: make(chan *watchCall, 100)}
	a.PrependWatchReactor("*", func(action k8stesting.Action) (bool, watch.Interface, error) {
		wa := action.(k8stesting.WatchActionImpl)
		w, err := a.Tracker().Watch(action.GetResource(), action.GetNamespace(), wa.ListOptions)
		if err != nil {
			return true, nil, err
		}
		call := &watchCall{gvr: action.GetResource(), resource: action.GetResource().Resource, ns: action.GetNamespace(), opts: wa.ListOptions, stopped: make(chan struct{})}
		a.mu.Lock()
		a.watches = append(a.watches, call)
		a.mu.Unlock()
		a.opened <- call
		return true, &countedWatch{Interface: w, call: call}, nil
	})
	a.PrependReactor("list", "*", func(action k8stesting.Action) (bool, runtime.Object, error) {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.lists = append(a.lists, action.(k8stesting.ListActionImpl).ListOptions)
		return false, nil, nil
	})
	a.PrependReactor("get", "*", func(action k8stesting.Action) (bool, runtime.Object, error) {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.gets = append(a.gets, action.(k8stesting.GetActionImpl).GetOptions)
		return false, nil, nil
	})
	return a
}

func (a *api) counts() (lists, watches, gets int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.lists), len(a.watches), len(a.gets)
}

// start runs a cache on a until the test ends. Its retries have no
// jitter, and its OnChange sends on the returned channel.
func start(t *testing.T, a *api, cfg Config) (*Cache, <-chan Ref) {
	t.Helper()
	cfg.Client = a
	return startOn(t, cfg)
}

// startOn is start on cfg.Client.
func startOn(t *testing.T, cfg Config) (*Cache, <-chan Ref) {
	t.Helper()
	changes := make(chan Ref, 100)
	cfg.OnChange = func(r Ref) { changes <- r }
	c, _, _ := runOn(t, cfg)
	return c, changes
}

// runOn runs a cache made of cfg, its retries without jitter, until
// cancel is called or the test ends; done is closed when Run has
// returned.
func runOn(t *testing.T, cfg Config) (c *Cache, cancel context.CancelFunc, done <-chan struct{}) {
	t.Helper()
	c = New(cfg)
	c.retry.Jitter = 0
	ctx, cancel := context.WithCancel(context.Background())
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		c.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-returned
	})
	return c, cancel, returned
}

// guard bounds a wait on a condition, so that a broken test fails instead
// of hanging; nothing in the tests is timed by it.
const guard = 30 * time.Second

func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(guard):
		t.Fatalf("no %s", what)
		var zero T
		return zero
	}
}

func closed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	recv(t, ch, what)
}

// notClosed reports whether ch is still open now.
func notClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return false
	default:
		return true
	}
}

// eventually polls cond with a deadline: for observing the result of
// asynchronous work (a loop waiting on the fake clock), never for
// ordering it.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, guard, true,
		func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatalf("timed out waiting for %s", what)
	}
}

func get(t *testing.T, c *Cache, r Ref) runtime.Object {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	o, err := c.Get(ctx, r)
	if err != nil {
		t.Fatalf("Get(%s): %v", r, err)
	}
	return o
}

func configMap(ns, name string, data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: data}
}

func dataOf(t *testing.T, o runtime.Object) string {
	t.Helper()
	switch o := o.(type) {
	case *corev1.ConfigMap:
		return o.Data["k"]
	case *corev1.Secret:
		return string(o.Data["k"])
	}
	t.Fatalf("unexpected %T", o)
	return ""
}

func newFakeClock() *testingclock.FakeClock { return testingclock.NewFakeClock(time.Now()) }
