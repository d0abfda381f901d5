package objectcache

import (
	"context"
	"errors"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"
)

// TestSlowOnChangeBlocksNoWatch: while OnChange is stuck, the watch goes
// on (Get sees later updates) and the changes of the ref are coalesced
// into one more call.
func TestSlowOnChangeBlocksNoWatch(t *testing.T) {
	a := newAPI(configMap("ns", "cm", map[string]string{"k": "v0"}))
	calls, unblock := make(chan Ref, 10), make(chan struct{})
	c := New(Config{Client: a, OnChange: func(r Ref) {
		calls <- r
		<-unblock
	}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx)
	}()
	defer func() {
		cancel()
		close(unblock)
		<-done
	}()
	c.Hold("pod", cmRef)
	get(t, c, cmRef)
	recv(t, a.opened, "watch")
	update := func(v string) {
		t.Helper()
		if _, err := a.CoreV1().ConfigMaps("ns").Update(context.Background(), configMap("ns", "cm", map[string]string{"k": v}), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	update("v1")
	recv(t, calls, "first OnChange") // now stuck
	for _, v := range []string{"v2", "v3", "v4"} {
		update(v)
		eventually(t, "Get to see "+v, func() bool { return dataOf(t, get(t, c, cmRef)) == v })
	}
	unblock <- struct{}{}
	recv(t, calls, "the coalesced OnChange")
	select {
	case r := <-calls:
		t.Errorf("a third OnChange(%s) for coalesced changes", r)
	default:
	}
}

// TestHoldBeforeRunAndStop: refs held before Run are read once it runs;
// when Run ends every watch is stopped, and a Get still waiting for a
// first answer returns ErrStopped.
func TestHoldBeforeRunAndStop(t *testing.T) {
	a := newAPI(configMap("ns", "cm", nil))
	release := make(chan struct{})
	// This reactor blocks the whole fake clientset (it runs its
	// reactors under one lock): it is reached only once cm is watched.
	a.PrependReactor("list", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		<-release
		return false, nil, nil
	})
	c := New(Config{Client: a})
	c.Hold("pod", cmRef)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx)
	}()
	get(t, c, cmRef)
	w := recv(t, a.opened, "watch")
	secret := Ref{Kind: Secret, Namespace: "ns", Name: "s"}
	c.Hold("pod2", secret)
	waiting := make(chan error)
	go func() {
		_, err := c.Get(context.Background(), secret)
		waiting <- err
	}()
	cancel()
	if err := recv(t, waiting, "Get's end"); !errors.Is(err, ErrStopped) {
		t.Errorf("Get waiting when Run ended: %v, want ErrStopped", err)
	}
	closed(t, w.stopped, "stop of the watch")
	close(release)
	<-done
}

// TestShortWatchBacksOff: a watch the server ends at once with no event
// is opened again only after the backoff, on the clock.
func TestShortWatchBacksOff(t *testing.T) {
	a := newAPI(configMap("ns", "cm", nil))
	ws := make(chan *watch.FakeWatcher, 10)
	a.PrependWatchReactor("configmaps", func(k8stesting.Action) (bool, watch.Interface, error) {
		w := watch.NewFake()
		ws <- w
		return true, w, nil
	})
	fc := newFakeClock()
	c, _ := start(t, a, Config{Clock: fc})
	c.Hold("pod", cmRef)
	get(t, c, cmRef)
	recv(t, ws, "first watch").Stop()
	eventually(t, "the backoff", fc.HasWaiters)
	select {
	case <-ws:
		t.Fatal("watch opened again before the backoff")
	default:
	}
	fc.Step(retry.Initial)
	recv(t, ws, "second watch")
}
