package objectcache

import (
	"context"
	"errors"
	"slices"
	"testing"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

// isWatchList reports a watch-list request as the kubelet's reflectors
// make it.
func isWatchList(o metav1.ListOptions) bool {
	return o.SendInitialEvents != nil && *o.SendInitialEvents && o.ResourceVersion == "" &&
		o.ResourceVersionMatch == metav1.ResourceVersionMatchNotOlderThan && o.AllowWatchBookmarks
}

// TestWatchListOneRequestPerEntry: against a server that serves
// watch-list requests, each entry (a configMap, a secret, a missing
// configMap, ClusterTrustBundles selected by signer and labels) is read
// and watched with one request, with the entry's selectors: its initial
// events answer Get (none before the bookmark: NotFound), and the same
// watch delivers the changes that follow.
func TestWatchListOneRequestPerEntry(t *testing.T) {
	ctb := func(name, label string) *certificatesv1.ClusterTrustBundle {
		return &certificatesv1.ClusterTrustBundle{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"pick": label}},
			Spec:       certificatesv1.ClusterTrustBundleSpec{SignerName: "s/a", TrustBundle: name},
		}
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"}, Data: map[string][]byte{"k": []byte("s1")}}
	a := newStreamAPI(streaming, configMap("ns", "cm", map[string]string{"k": "v1"}), configMap("ns", "beside", nil),
		secret, ctb("s:a:1", "yes"), ctb("s:a:2", "no"))
	c, _ := startOn(t, Config{Client: a})
	missing := Ref{Kind: ConfigMap, Namespace: "ns", Name: "missing"}
	secRef := Ref{Kind: Secret, Namespace: "ns", Name: "s"}
	sel := Ref{Kind: ClusterTrustBundle, Fields: "spec.signerName=s/a", Labels: "pick=yes"}
	c.Hold("pod", cmRef, missing, secRef, sel)
	if got := dataOf(t, get(t, c, cmRef)); got != "v1" {
		t.Errorf("Get(cm) = %q, want v1", got)
	}
	if got := dataOf(t, get(t, c, secRef)); got != "s1" {
		t.Errorf("Get(secret) = %q, want s1", got)
	}
	if _, err := c.Get(context.Background(), missing); !apierrors.IsNotFound(err) {
		t.Errorf("Get(missing) = %v, want NotFound", err)
	}
	objs, err := c.List(context.Background(), sel)
	if err != nil || len(objs) != 1 || nameOf(objs[0]) != "s:a:1" {
		t.Errorf("List(bundles) = %v, %v; want [s:a:1]", objs, err)
	}

	cms := a.CoreV1().ConfigMaps("ns")
	if _, err := cms.Update(context.Background(), configMap("ns", "cm", map[string]string{"k": "v2"}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cms.Create(context.Background(), configMap("ns", "missing", map[string]string{"k": "new"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the update and the new configMap", func() bool {
		o, err := c.Get(context.Background(), missing)
		return dataOf(t, get(t, c, cmRef)) == "v2" && err == nil && dataOf(t, o) == "new"
	})

	lists, watches, gets := a.counts()
	if lists != 0 || watches != 4 || gets != 0 {
		t.Errorf("%d lists, %d watches, %d gets; want one watch per entry and nothing else", lists, watches, gets)
	}
	var selectors []string
	for _, w := range a.calls() {
		if !isWatchList(w.opts) {
			t.Errorf("watch of %s with %+v, want a watch-list request", w.resource, w.opts)
		}
		selectors = append(selectors, w.resource+" "+w.ns+" "+w.opts.FieldSelector+" "+w.opts.LabelSelector)
	}
	slices.Sort(selectors)
	want := []string{
		"clustertrustbundles  spec.signerName=s/a pick=yes",
		"configmaps ns metadata.name=cm ", "configmaps ns metadata.name=missing ", "secrets ns metadata.name=s ",
	}
	if !slices.Equal(selectors, want) {
		t.Errorf("watches %q, want %q", selectors, want)
	}
}

// TestWatchListResumesAndRelists: a watch-list that the server ends is
// resumed with a plain watch from the bookmark's version; when that
// version is gone (410), one watch-list request reads the entry afresh
// and replaces what it held (an object deleted meanwhile is gone).
func TestWatchListResumesAndRelists(t *testing.T) {
	a := newStreamAPI(streaming, configMap("ns", "cm", map[string]string{"k": "v1"}))
	c, changes := startOn(t, Config{Client: a})
	c.Hold("pod", cmRef)
	get(t, c, cmRef)
	first := recv(t, a.streams, "watch-list")
	cms := a.CoreV1().ConfigMaps("ns")
	if _, err := cms.Update(context.Background(), configMap("ns", "cm", map[string]string{"k": "v2"}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	recv(t, changes, "OnChange of the update")
	release := make(chan struct{})
	a.expireNext(release)
	first.close()
	eventually(t, "the resumed watch", func() bool { _, w, _ := a.counts(); return w == 2 })
	// No watch is open: the deletion is missed, as while a server is away.
	if err := cms.Delete(context.Background(), "cm", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	close(release)
	recv(t, changes, "OnChange of the deletion")
	if _, err := c.Get(context.Background(), cmRef); !apierrors.IsNotFound(err) {
		t.Errorf("Get after the relist = %v, want NotFound", err)
	}
	lists, watches, _ := a.counts()
	if lists != 0 || watches != 3 {
		t.Fatalf("%d lists, %d watches; want 0 and 3", lists, watches)
	}
	resumed := a.calls()[1].opts
	if resumed.SendInitialEvents != nil || resumed.ResourceVersionMatch != "" || resumed.ResourceVersion != "1" {
		t.Errorf("resumed watch with %+v, want a plain watch from the bookmark's version 1", resumed)
	}
	if !isWatchList(a.calls()[2].opts) {
		t.Errorf("watch after the 410 with %+v, want a watch-list request", a.calls()[2].opts)
	}
}

// TestWatchListFallback: a server that refuses watch-list requests (422)
// or ignores sendInitialEvents (a plain watch: a bookmark comes without
// the annotation) is read with a list and then a watch, the first entry
// at once and every later one without trying again.
func TestWatchListFallback(t *testing.T) {
	for _, tc := range []struct {
		name   string
		server server
	}{
		{"refused", refusing},
		{"ignored", ignoring},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newStreamAPI(tc.server, configMap("ns", "cm", map[string]string{"k": "v1"}), configMap("ns", "cm2", map[string]string{"k": "w"}))
			c, _ := startOn(t, Config{Client: a})
			cm2 := Ref{Kind: ConfigMap, Namespace: "ns", Name: "cm2"}
			c.Hold("pod", cmRef)
			if got := dataOf(t, get(t, c, cmRef)); got != "v1" {
				t.Errorf("Get = %q, want v1", got)
			}
			c.Hold("pod2", cm2)
			if got := dataOf(t, get(t, c, cm2)); got != "w" {
				t.Errorf("Get = %q, want w", got)
			}
			if _, err := a.CoreV1().ConfigMaps("ns").Update(context.Background(), configMap("ns", "cm", map[string]string{"k": "v2"}), metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the update", func() bool { return dataOf(t, get(t, c, cmRef)) == "v2" })
			// cm2's Get answers from its list, before its watch opens.
			eventually(t, "the watch of cm2", func() bool { _, w, _ := a.counts(); return w >= 3 })
			lists, watches, _ := a.counts()
			if lists != 2 || watches != 3 {
				t.Fatalf("%d lists, %d watches; want 2 and 3 (one watch-list, then a list and a watch per entry)", lists, watches)
			}
			if !isWatchList(a.calls()[0].opts) {
				t.Errorf("first watch with %+v, want a watch-list request", a.calls()[0].opts)
			}
			for _, w := range a.calls()[1:] {
				if w.opts.SendInitialEvents != nil {
					t.Errorf("watch after the fallback with %+v, want a plain watch", w.opts)
				}
			}
			if tc.server == ignoring {
				closed(t, a.calls()[0].stopped, "stop of the ignored watch-list")
			}
		})
	}
}

// TestWatchListImmutable: an immutable object's watch-list is stopped
// after its initial events; the object is kept.
func TestWatchListImmutable(t *testing.T) {
	cm := configMap("ns", "cm", map[string]string{"k": "v"})
	cm.Immutable = ptr.To(true)
	a := newStreamAPI(streaming, cm)
	c, _ := startOn(t, Config{Client: a})
	c.Hold("pod", cmRef)
	get(t, c, cmRef)
	eventually(t, "the loop to end", func() bool { return c.running.Load() == 0 })
	if lists, watches, _ := a.counts(); lists != 0 || watches != 1 {
		t.Errorf("%d lists, %d watches; want 0 and 1", lists, watches)
	}
	closed(t, a.calls()[0].stopped, "stop of the watch-list")
	if dataOf(t, get(t, c, cmRef)) != "v" {
		t.Error("immutable object not kept")
	}
}

// TestWatchListForbidden: a watch-list the node may not make is Get's
// answer (Forbidden), as a refused list was, and is no reason to stop
// making watch-list requests.
func TestWatchListForbidden(t *testing.T) {
	a := newStreamAPI(streaming)
	forbidden := apierrors.NewForbidden(corev1.Resource("secrets"), "s", errors.New("no relationship found between node and this object"))
	a.PrependWatchReactor("secrets", func(k8stesting.Action) (bool, watch.Interface, error) { return true, nil, forbidden })
	c, _ := startOn(t, Config{Client: a, Clock: newFakeClock()})
	r := Ref{Kind: Secret, Namespace: "ns", Name: "s"}
	c.Hold("pod", r)
	if _, err := c.Get(context.Background(), r); !apierrors.IsForbidden(err) {
		t.Errorf("Get = %v, want Forbidden", err)
	}
	if !c.streams() {
		t.Error("a Forbidden watch-list turned watch-list requests off")
	}
	if lists, _, _ := a.counts(); lists != 0 {
		t.Errorf("%d lists, want none", lists)
	}
}
