package objectcache

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

var cmRef = Ref{Kind: ConfigMap, Namespace: "ns", Name: "cm"}

// TestTwoHoldersShareOneWatch: two pods holding one configMap make one
// list and one watch, each with the field selector on its name in its
// namespace; a configMap beside it (which the fake's watch also sends)
// is not taken for it.
func TestTwoHoldersShareOneWatch(t *testing.T) {
	a := newAPI(configMap("ns", "cm", map[string]string{"k": "v1"}))
	c, _ := start(t, a, Config{})
	c.Hold("pod1", cmRef)
	c.Hold("pod2", cmRef, cmRef)
	for _, h := range []string{"pod1", "pod2"} {
		if got := dataOf(t, get(t, c, cmRef)); got != "v1" {
			t.Errorf("%s: Get = %q, want v1", h, got)
		}
	}
	w := recv(t, a.opened, "watch")
	if w.resource != "configmaps" || w.ns != "ns" || w.opts.FieldSelector != "metadata.name=cm" || !w.opts.AllowWatchBookmarks {
		t.Errorf("watch %s in %q with %+v, want configmaps in ns, metadata.name=cm, bookmarks", w.resource, w.ns, w.opts)
	}
	if _, err := a.CoreV1().ConfigMaps("ns").Create(context.Background(), configMap("ns", "a-other", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.CoreV1().ConfigMaps("ns").Update(context.Background(), configMap("ns", "cm", map[string]string{"k": "v2"}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the update", func() bool { return dataOf(t, get(t, c, cmRef)) == "v2" })
	if o := get(t, c, cmRef); nameOf(o) != "cm" {
		t.Errorf("Get = %s, want cm", nameOf(o))
	}
	if lists, watches, _ := a.counts(); lists != 1 || watches != 1 {
		t.Errorf("%d lists, %d watches, want 1 and 1", lists, watches)
	}
	if a.lists[0].FieldSelector != "metadata.name=cm" {
		t.Errorf("list field selector %q, want metadata.name=cm", a.lists[0].FieldSelector)
	}
	if got, want := c.Holders(cmRef), []string{"pod1", "pod2"}; !slices.Equal(got, want) {
		t.Errorf("Holders = %v, want %v", got, want)
	}
}

// TestReleaseOfLastHolderStopsWatch: the watch lives while one holder
// holds the object and is stopped with the last; the ref is then not
// held.
func TestReleaseOfLastHolderStopsWatch(t *testing.T) {
	a := newAPI(configMap("ns", "cm", nil))
	c, _ := start(t, a, Config{})
	c.Hold("pod1", cmRef)
	c.Hold("pod2", cmRef)
	w := recv(t, a.opened, "watch")
	c.Release("pod1")
	get(t, c, cmRef)
	if !notClosed(w.stopped) {
		t.Fatal("watch stopped while pod2 holds the object")
	}
	c.Release("pod2")
	closed(t, w.stopped, "stop of the watch")
	if _, err := c.Get(context.Background(), cmRef); !errors.Is(err, ErrNotHeld) {
		t.Errorf("Get after the last release: %v, want ErrNotHeld", err)
	}
	if hs := c.Holders(cmRef); len(hs) != 0 {
		t.Errorf("Holders = %v, want none", hs)
	}
}

// TestHoldReplaces: what a holder holds is what its last Hold said.
func TestHoldReplaces(t *testing.T) {
	ref := func(n string) Ref { return Ref{Kind: ConfigMap, Namespace: "ns", Name: n} }
	a := newAPI(configMap("ns", "a", nil), configMap("ns", "b", nil), configMap("ns", "c", nil))
	c, _ := start(t, a, Config{})
	c.Hold("pod", ref("a"), ref("b"))
	watches := map[string]*watchCall{}
	for range 2 {
		w := recv(t, a.opened, "watch")
		watches[w.opts.FieldSelector] = w
	}
	c.Hold("pod", ref("b"), ref("c"))
	closed(t, watches["metadata.name=a"].stopped, "stop of a's watch")
	w := recv(t, a.opened, "watch of c")
	if w.opts.FieldSelector != "metadata.name=c" {
		t.Errorf("new watch %q, want metadata.name=c", w.opts.FieldSelector)
	}
	if !notClosed(watches["metadata.name=b"].stopped) {
		t.Error("b's watch stopped although still held")
	}
	for _, tt := range []struct {
		name string
		held bool
	}{{"a", false}, {"b", true}, {"c", true}} {
		_, err := c.Get(context.Background(), ref(tt.name))
		if held := !errors.Is(err, ErrNotHeld); held != tt.held {
			t.Errorf("%s: held %v (%v), want %v", tt.name, held, err, tt.held)
		}
	}
}

// TestChangesReachOnChange: an update, a delete and a re-creation each
// reach OnChange through the watch, and Get answers the new state.
func TestChangesReachOnChange(t *testing.T) {
	a := newAPI(configMap("ns", "cm", map[string]string{"k": "v1"}))
	c, changes := start(t, a, Config{})
	c.Hold("pod", cmRef)
	get(t, c, cmRef)
	recv(t, a.opened, "watch")
	cms := a.CoreV1().ConfigMaps("ns")
	ctx := context.Background()
	for _, tt := range []struct {
		name   string
		change func() error
		want   string // "" for NotFound
	}{
		{"update", func() error {
			_, err := cms.Update(ctx, configMap("ns", "cm", map[string]string{"k": "v2"}), metav1.UpdateOptions{})
			return err
		}, "v2"},
		{"delete", func() error { return cms.Delete(ctx, "cm", metav1.DeleteOptions{}) }, ""},
		{"create again", func() error {
			_, err := cms.Create(ctx, configMap("ns", "cm", map[string]string{"k": "v3"}), metav1.CreateOptions{})
			return err
		}, "v3"},
	} {
		if err := tt.change(); err != nil {
			t.Fatal(err)
		}
		if r := recv(t, changes, "OnChange after "+tt.name); r != cmRef {
			t.Errorf("%s: OnChange(%s), want %s", tt.name, r, cmRef)
		}
		o, err := c.Get(ctx, cmRef)
		switch {
		case tt.want == "" && !apierrors.IsNotFound(err):
			t.Errorf("%s: Get = %v, %v, want NotFound", tt.name, o, err)
		case tt.want != "" && (err != nil || dataOf(t, o) != tt.want):
			t.Errorf("%s: Get = %v, %v, want %q", tt.name, o, err, tt.want)
		}
	}
	if _, watches, _ := a.counts(); watches != 1 {
		t.Errorf("%d watches, want 1", watches)
	}
}

// TestImmutableStopsWatching: an immutable configMap or secret is read
// once and not watched; one made immutable stops its watch on that
// event; Get keeps answering it.
func TestImmutableStopsWatching(t *testing.T) {
	secret := func(immutable bool) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cm"}, Data: map[string][]byte{"k": []byte("v")}, Immutable: ptr.To(immutable)}
	}
	cm := func(immutable bool) *corev1.ConfigMap {
		o := configMap("ns", "cm", map[string]string{"k": "v"})
		o.Immutable = ptr.To(immutable)
		return o
	}
	for _, tt := range []struct {
		name   string
		kind   Kind
		object func(immutable bool) runtime.Object
	}{
		{"configMap", ConfigMap, func(i bool) runtime.Object { return cm(i) }},
		{"secret", Secret, func(i bool) runtime.Object { return secret(i) }},
	} {
		t.Run(tt.name+" immutable from the start", func(t *testing.T) {
			a := newAPI(tt.object(true))
			c, _ := start(t, a, Config{})
			r := Ref{Kind: tt.kind, Namespace: "ns", Name: "cm"}
			c.Hold("pod", r)
			get(t, c, r)
			c.Hold("pod2", r) // a second holder, on an entry whose loop ended
			eventually(t, "the loop to end", func() bool { return c.running.Load() == 0 })
			if lists, watches, _ := a.counts(); lists != 1 || watches != 0 {
				t.Errorf("%d lists, %d watches, want 1 and 0", lists, watches)
			}
			if dataOf(t, get(t, c, r)) != "v" {
				t.Error("immutable object not kept")
			}
		})
		t.Run(tt.name+" made immutable", func(t *testing.T) {
			a := newAPI(tt.object(false))
			c, changes := start(t, a, Config{})
			r := Ref{Kind: tt.kind, Namespace: "ns", Name: "cm"}
			c.Hold("pod", r)
			get(t, c, r)
			w := recv(t, a.opened, "watch")
			if err := a.Tracker().Update(w.gvr, tt.object(true), "ns"); err != nil {
				t.Fatal(err)
			}
			recv(t, changes, "OnChange")
			closed(t, w.stopped, "stop of the watch")
			if dataOf(t, get(t, c, r)) != "v" {
				t.Error("immutable object not kept")
			}
		})
	}
}

// TestGetWaitsForTheFirstAnswer: Get blocks until the entry's first list
// answers, bounded by its context.
func TestGetWaitsForTheFirstAnswer(t *testing.T) {
	a := newAPI(configMap("ns", "cm", map[string]string{"k": "v1"}))
	listing, release := make(chan struct{}), make(chan struct{})
	a.PrependReactor("list", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		close(listing)
		<-release
		return false, nil, nil
	})
	c, _ := start(t, a, Config{})
	c.Hold("pod", cmRef)
	closed(t, listing, "list")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Get(ctx, cmRef); !errors.Is(err, context.Canceled) {
		t.Fatalf("Get with the list pending and a cancelled context: %v, want context.Canceled", err)
	}
	got := make(chan runtime.Object)
	go func() {
		o, _ := c.Get(context.Background(), cmRef)
		got <- o
	}()
	close(release)
	if o := recv(t, got, "Get's answer"); o == nil || dataOf(t, o) != "v1" {
		t.Errorf("Get = %v, want the configMap", o)
	}
}

// TestGetErrors: how Get reports what it cannot answer.
func TestGetErrors(t *testing.T) {
	forbidden := apierrors.NewForbidden(corev1.Resource("secrets"), "", errors.New("no relationship found between node and this object"))
	for _, tt := range []struct {
		name    string
		ref     Ref
		hold    bool
		listErr error
		check   func(error) bool
	}{
		{"not found", Ref{Kind: ConfigMap, Namespace: "ns", Name: "missing"}, true, nil, apierrors.IsNotFound},
		{"forbidden", Ref{Kind: Secret, Namespace: "ns", Name: "s"}, true, forbidden, apierrors.IsForbidden},
		{"not held", cmRef, false, nil, func(err error) bool { return errors.Is(err, ErrNotHeld) }},
		{"unknown kind", Ref{Kind: "Pod", Namespace: "ns", Name: "p"}, true, nil, isInvalid},
		{"namespaced without namespace", Ref{Kind: ConfigMap, Name: "cm"}, true, nil, isInvalid},
		{"cluster-scoped with namespace", Ref{Kind: ClusterTrustBundle, Namespace: "ns", Name: "b"}, true, nil, isInvalid},
		{"name and selector", Ref{Kind: ClusterTrustBundle, Name: "b", Labels: "a=b"}, true, nil, isInvalid},
		{"field not allowed", Ref{Kind: ClusterTrustBundle, Fields: "spec.trustBundle=x"}, true, nil, isInvalid},
		{"bad label selector", Ref{Kind: ClusterTrustBundle, Labels: "a=(b"}, true, nil, isInvalid},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := newAPI()
			if tt.listErr != nil {
				a.PrependReactor("list", "*", func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, tt.listErr })
			}
			c, _ := start(t, a, Config{})
			if tt.hold {
				c.Hold("pod", tt.ref)
			}
			var err error
			if tt.ref.Name != "" {
				_, err = c.Get(context.Background(), tt.ref)
			} else {
				_, err = c.List(context.Background(), tt.ref)
			}
			if !tt.check(err) {
				t.Errorf("error %v", err)
			}
			if lists, _, _ := a.counts(); isInvalid(err) && lists != 0 {
				t.Errorf("%d lists for an invalid ref", lists)
			}
		})
	}
}

func isInvalid(err error) bool { return errors.Is(err, errInvalidRef) }

// TestFailedReadsRetryWithBackoff: a forbidden first list is Get's answer
// until a retry, after the backoff on the clock, lists the object (which
// OnChange announces); a failed watch is retried the same way, and Get
// keeps the listed object meanwhile.
func TestFailedReadsRetryWithBackoff(t *testing.T) {
	a := newAPI(configMap("ns", "cm", map[string]string{"k": "v1"}))
	failLists, failWatches := 1, 1
	a.PrependReactor("list", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		if failLists > 0 {
			failLists--
			return true, nil, apierrors.NewForbidden(corev1.Resource("configmaps"), "cm", errors.New("not yet"))
		}
		return false, nil, nil
	})
	a.PrependWatchReactor("configmaps", func(k8stesting.Action) (bool, watch.Interface, error) {
		if failWatches > 0 {
			failWatches--
			return true, nil, apierrors.NewInternalError(errors.New("etcd"))
		}
		return false, nil, nil
	})
	fc := newFakeClock()
	c, changes := start(t, a, Config{Clock: fc})
	c.Hold("pod", cmRef)
	if _, err := c.Get(context.Background(), cmRef); !apierrors.IsForbidden(err) {
		t.Fatalf("Get after a forbidden list: %v, want Forbidden", err)
	}
	eventually(t, "the list's backoff", fc.HasWaiters)
	fc.Step(retry.Initial)
	if r := recv(t, changes, "OnChange when the object appears"); r != cmRef {
		t.Errorf("OnChange(%s)", r)
	}
	if dataOf(t, get(t, c, cmRef)) != "v1" {
		t.Error("Get after the retried list")
	}
	eventually(t, "the watch's backoff", fc.HasWaiters)
	fc.Step(retry.Max)
	recv(t, a.opened, "the retried watch")
	// The refused list and watch are answered before the counting
	// reactors: one list and one watch reached the fake tracker.
	if lists, watches, _ := a.counts(); lists != 1 || watches != 1 {
		t.Errorf("%d lists, %d watches opened, want 1 and 1", lists, watches)
	}
}

// TestHoldersFollowHold: Holders answers, sorted, the holders that hold a
// ref as Hold, a replacing Hold and Release change them, one ref's
// holders apart from another's.
func TestHoldersFollowHold(t *testing.T) {
	c := New(Config{Client: newAPI()}) // not run: holding reads nothing
	other := Ref{Kind: ConfigMap, Namespace: "ns", Name: "other"}
	steps := []struct {
		name        string
		do          func()
		cm, another []string
	}{
		{"three hold cm, in reverse order", func() { c.Hold("c", cmRef); c.Hold("b", cmRef, other); c.Hold("a", cmRef) },
			[]string{"a", "b", "c"}, []string{"b"}},
		{"b holds the other ref alone", func() { c.Hold("b", other) }, []string{"a", "c"}, []string{"b"}},
		{"b holds cm again, twice over", func() { c.Hold("b", cmRef, cmRef, other) }, []string{"a", "b", "c"}, []string{"b"}},
		{"a and c let go", func() { c.Release("a"); c.Release("c") }, []string{"b"}, []string{"b"}},
		{"b lets go", func() { c.Release("b") }, nil, nil},
	}
	for _, s := range steps {
		s.do()
		if got := c.Holders(cmRef); !slices.Equal(got, s.cm) {
			t.Errorf("%s: Holders(cm) = %v, want %v", s.name, got, s.cm)
		}
		if got := c.Holders(other); !slices.Equal(got, s.another) {
			t.Errorf("%s: Holders(other) = %v, want %v", s.name, got, s.another)
		}
	}
	if len(c.entries) != 0 {
		t.Errorf("%d entries left with no holder", len(c.entries))
	}
}

// BenchmarkHolders: the holders of one ref among 5,000 holders of a ref
// each (a node's pods and their volumes), as the volume
// manager asks at each volume's read.
func BenchmarkHolders(b *testing.B) {
	c := New(Config{Client: newAPI()})
	refs := make([]Ref, 5000)
	for i := range refs {
		refs[i] = Ref{Kind: PersistentVolume, Name: fmt.Sprintf("pv-%05d", i)}
		c.Hold(fmt.Sprintf("pod-%05d", i), refs[i])
	}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if len(c.Holders(refs[i%len(refs)])) != 1 {
			b.Fatal("not one holder")
		}
	}
}
