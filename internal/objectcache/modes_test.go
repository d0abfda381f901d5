package objectcache

import (
	"context"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"
)

// TestGetModeRefreshesAfterTTL: in ModeGet an object is read by GET at
// once, again (from the API server's cache) when the TTL has passed on
// the clock, and a change found so reaches OnChange; no watch is opened.
func TestGetModeRefreshesAfterTTL(t *testing.T) {
	cm := configMap("ns", "cm", map[string]string{"k": "v1"})
	cm.ResourceVersion = "1"
	a := newAPI(cm)
	fc := newFakeClock()
	c, changes := start(t, a, Config{Clock: fc, Mode: ModeGet, TTL: 10 * time.Minute})
	c.Hold("pod", cmRef)
	if dataOf(t, get(t, c, cmRef)) != "v1" {
		t.Fatal("first Get")
	}
	eventually(t, "the wait for the TTL", fc.HasWaiters)
	cm2 := configMap("ns", "cm", map[string]string{"k": "v2"})
	cm2.ResourceVersion = "2"
	if err := a.Tracker().Update(corev1.SchemeGroupVersion.WithResource("configmaps"), cm2, "ns"); err != nil {
		t.Fatal(err)
	}
	fc.Step(10*time.Minute - time.Second)
	if dataOf(t, get(t, c, cmRef)) != "v1" {
		t.Error("refreshed before the TTL")
	}
	fc.Step(time.Second)
	if r := recv(t, changes, "OnChange after the refresh"); r != cmRef {
		t.Errorf("OnChange(%s)", r)
	}
	if dataOf(t, get(t, c, cmRef)) != "v2" {
		t.Error("Get after the refresh")
	}
	eventually(t, "the next wait", fc.HasWaiters)
	fc.Step(10 * time.Minute) // the same object again: no change announced
	eventually(t, "the third GET", func() bool { _, _, gets := a.counts(); return gets == 3 })
	a.mu.Lock()
	gets := append([]metav1.GetOptions(nil), a.gets...)
	a.mu.Unlock()
	if gets[0].ResourceVersion != "" || gets[1].ResourceVersion != "0" {
		t.Errorf("GET options %+v, want the first consistent, the refreshes from the cache (\"0\")", gets)
	}
	if lists, watches, _ := a.counts(); lists != 0 || watches != 0 {
		t.Errorf("%d lists, %d watches in ModeGet", lists, watches)
	}
	select {
	case r := <-changes:
		t.Errorf("OnChange(%s) for an unchanged object", r)
	default:
	}
}

// TestGetModeNotFound: in ModeGet a missing object is NotFound, not an
// error of the read.
func TestGetModeNotFound(t *testing.T) {
	a := newAPI()
	c, _ := start(t, a, Config{Clock: newFakeClock(), Mode: ModeGet})
	c.Hold("pod", cmRef)
	if _, err := c.Get(context.Background(), cmRef); !apierrors.IsNotFound(err) {
		t.Errorf("Get = %v, want NotFound", err)
	}
}

// TestTrustBundleSelection: a selecting Ref holds the ClusterTrustBundles
// of one signer with matching labels, sends both selectors to the API
// server, and follows a label change.
func TestTrustBundleSelection(t *testing.T) {
	ctb := func(name, signer, label string) *certificatesv1.ClusterTrustBundle {
		return &certificatesv1.ClusterTrustBundle{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"pick": label}},
			Spec:       certificatesv1.ClusterTrustBundleSpec{SignerName: signer, TrustBundle: name},
		}
	}
	a := newAPI(ctb("s:a:1", "s/a", "yes"), ctb("s:a:2", "s/a", "no"), ctb("s:b:1", "s/b", "yes"))
	c, changes := start(t, a, Config{})
	r := Ref{Kind: ClusterTrustBundle, Fields: "spec.signerName=s/a", Labels: "pick=yes"}
	c.Hold("pod", r)
	names := func() []string {
		objs, err := c.List(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		var ns []string
		for _, o := range objs {
			ns = append(ns, nameOf(o))
		}
		return ns
	}
	if got := names(); len(got) != 1 || got[0] != "s:a:1" {
		t.Errorf("List = %v, want [s:a:1]", got)
	}
	w := recv(t, a.opened, "watch")
	if w.ns != "" || w.opts.FieldSelector != "spec.signerName=s/a" || w.opts.LabelSelector != "pick=yes" {
		t.Errorf("watch in %q with %+v", w.ns, w.opts)
	}
	if _, err := a.CertificatesV1().ClusterTrustBundles().Update(context.Background(), ctb("s:a:2", "s/a", "yes"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	recv(t, changes, "OnChange")
	if got := names(); len(got) != 2 || got[0] != "s:a:1" || got[1] != "s:a:2" {
		t.Errorf("List after the label change = %v, want [s:a:1 s:a:2]", got)
	}
	if _, err := c.Get(context.Background(), r); !isInvalid(err) {
		t.Errorf("Get of a selecting ref: %v, want invalid", err)
	}
}

// TestWatchResumes: a watch that ends is opened again from the last
// resource version it saw, at once when it made progress; one the server
// ends with 410 Gone lists again.
func TestWatchResumes(t *testing.T) {
	a := newAPI(configMap("ns", "cm", map[string]string{"k": "v1"}))
	// The fake sets no resourceVersion on objects: hand out watches the
	// test drives, with versions.
	ws := make(chan *watch.FakeWatcher, 10)
	a.PrependWatchReactor("configmaps", func(k8stesting.Action) (bool, watch.Interface, error) {
		w := watch.NewFake()
		ws <- w
		return true, w, nil
	})
	fc := newFakeClock()
	c, changes := start(t, a, Config{Clock: fc})
	c.Hold("pod", cmRef)
	get(t, c, cmRef)
	w := recv(t, ws, "first watch")
	cm := func(v, rv string) runtime.Object {
		o := configMap("ns", "cm", map[string]string{"k": v})
		o.ResourceVersion = rv
		return o
	}
	w.Modify(cm("v2", "7"))
	recv(t, changes, "OnChange")
	w.Stop() // the server ends the watch after an event: resumed at once
	w2 := recv(t, ws, "second watch")
	w2.Error(&apierrors.NewResourceExpired("too old resource version: 7 (9)").ErrStatus)
	recv(t, ws, "third watch, after a list")
	var rvs []string
	for _, act := range a.Actions() {
		if wa, ok := act.(k8stesting.WatchActionImpl); ok {
			rvs = append(rvs, wa.ListOptions.ResourceVersion)
		}
	}
	if lists, _, _ := a.counts(); lists != 2 {
		t.Errorf("%d lists, want 2 (the first, and after the Gone)", lists)
	}
	if len(rvs) != 3 || rvs[1] != "7" || rvs[2] == "7" {
		t.Errorf("watch versions %q, want the second from 7, the third from the new list", rvs)
	}
	if dataOf(t, get(t, c, cmRef)) != "v1" {
		t.Error("Get after the relist: want the listed object")
	}
}
