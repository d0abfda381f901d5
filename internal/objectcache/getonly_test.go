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
)

var (
	pvcRef = Ref{Kind: PersistentVolumeClaim, Namespace: "ns", Name: "c"}
	pvRef  = Ref{Kind: PersistentVolume, Name: "pv"}
	vaRef  = Ref{Kind: VolumeAttachment, Name: "va"}
)

func claim(volume string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}, Spec: corev1.PersistentVolumeClaimSpec{VolumeName: volume}}
}

// gate blocks the GETs of a resource until open is closed.
type gate struct{ open chan struct{} }

func newGate(a *api, resource string) *gate {
	g := &gate{open: make(chan struct{})}
	a.PrependReactor("get", resource, func(k8stesting.Action) (bool, runtime.Object, error) {
		<-g.open
		return false, nil, nil
	})
	return g
}

// waitGets waits for the entry loops to be waiting on the clock again
// (each read done) and returns the GETs made so far.
func waitGets(t *testing.T, a *api, fc interface{ HasWaiters() bool }) int {
	t.Helper()
	eventually(t, "the loops waiting on the clock", fc.HasWaiters)
	_, _, gets := a.counts()
	return gets
}

// TestMixedKindsInOneCache: a watched kind (a configMap) and a GET-only
// kind (a claim) held by one pod in one cache: the configMap is listed
// and watched, the claim only ever GET (never listed or watched, whatever
// the Mode), first at once and then every TTL. Peek does not wait: before
// the claim's first answer it says so, and that answer is announced;
// after it, Peek answers from the cache. The last holder's release stops
// both reads.
func TestMixedKindsInOneCache(t *testing.T) {
	a := newAPI(configMap("ns", "cm", map[string]string{"k": "v1"}), claim(""))
	g := newGate(a, "persistentvolumeclaims")
	fc := newFakeClock()
	c, changes := start(t, a, Config{Clock: fc, TTL: time.Minute})
	c.Hold("pod", cmRef, pvcRef)
	if _, err := c.Peek(pvcRef); !errors.Is(err, ErrNotAnswered) {
		t.Fatalf("Peek before the first answer: %v, want ErrNotAnswered", err)
	}
	close(g.open)
	if r := recv(t, changes, "the first answer announced"); r != pvcRef {
		t.Fatalf("OnChange(%s), want the peeked claim", r)
	}
	if o, err := c.Peek(pvcRef); err != nil || nameOf(o) != "c" {
		t.Fatalf("Peek after the answer: %v, %v", o, err)
	}
	if dataOf(t, get(t, c, cmRef)) != "v1" {
		t.Fatal("Get of the configMap")
	}
	w := recv(t, a.opened, "the configMap's watch")
	if w.resource != "configmaps" {
		t.Errorf("watch of %s, want only the configMap's", w.resource)
	}
	if gets := waitGets(t, a, fc); gets != 1 {
		t.Fatalf("%d GETs, want 1", gets)
	}
	updated := claim("pv")
	if err := a.Tracker().Update(corev1.SchemeGroupVersion.WithResource("persistentvolumeclaims"), updated, "ns"); err != nil {
		t.Fatal(err)
	}
	fc.Step(time.Minute)
	if r := recv(t, changes, "the refreshed claim"); r != pvcRef {
		t.Fatalf("OnChange(%s)", r)
	}
	if gets := waitGets(t, a, fc); gets != 2 {
		t.Fatalf("%d GETs after one TTL, want 2", gets)
	}
	if o, _ := c.Peek(pvcRef); o.(*corev1.PersistentVolumeClaim).Spec.VolumeName != "pv" {
		t.Error("Peek after the refresh: want the bound claim")
	}
	a.mu.Lock()
	lists := len(a.lists)
	a.mu.Unlock()
	for _, act := range a.Actions() {
		if act.GetResource().Resource == "persistentvolumeclaims" && act.GetVerb() != "get" {
			t.Errorf("%s of claims: a GET-only kind is only ever GET", act.GetVerb())
		}
	}
	if lists != 1 {
		t.Errorf("%d lists, want the configMap's only", lists)
	}
	c.Release("pod")
	eventually(t, "both reads stopped", func() bool { return c.running.Load() == 0 })
	closed(t, w.stopped, "the configMap's watch stopped")
	if _, err := c.Peek(pvcRef); !errors.Is(err, ErrNotHeld) {
		t.Errorf("Peek after the release: %v, want ErrNotHeld", err)
	}
}

// TestDropWithLastHolder: a claim held by two pods is read by one loop;
// it is read while either holds it and dropped, its loop stopped, with
// the last.
func TestDropWithLastHolder(t *testing.T) {
	a := newAPI(claim(""))
	fc := newFakeClock()
	c, _ := start(t, a, Config{Clock: fc, TTL: time.Minute})
	c.Hold("pod1", pvcRef)
	c.Hold("pod2", pvcRef, pvRef)
	get(t, c, pvcRef)
	eventually(t, "two loops", func() bool { return c.running.Load() == 2 })
	c.Release("pod1")
	if _, err := c.Peek(pvcRef); err != nil {
		t.Fatalf("Peek while pod2 holds it: %v", err)
	}
	c.Hold("pod2", pvRef)
	eventually(t, "the claim's loop stopped", func() bool { return c.running.Load() == 1 })
	if _, err := c.Peek(pvcRef); !errors.Is(err, ErrNotHeld) {
		t.Errorf("Peek of the dropped claim: %v, want ErrNotHeld", err)
	}
	c.Release("pod2")
	eventually(t, "every loop stopped", func() bool { return c.running.Load() == 0 })
}

// TestAttachmentPolledQuickly: a VolumeAttachment not attached yet is
// read again after 1 s, then 1.5 s, 2.25 s, ...; the read that finds it
// attached is announced, and from then on it is read every TTL only.
func TestAttachmentPolledQuickly(t *testing.T) {
	va := &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "va"}}
	a := newAPI(va)
	fc := newFakeClock()
	c, changes := start(t, a, Config{Clock: fc, TTL: time.Minute})
	c.Hold("volume", vaRef)
	get(t, c, vaRef)
	steps := []time.Duration{pollFirst, pollFirst * 3 / 2}
	for i, d := range steps {
		if gets := waitGets(t, a, fc); gets != i+1 {
			t.Fatalf("%d GETs, want %d", gets, i+1)
		}
		fc.Step(d)
	}
	if gets := waitGets(t, a, fc); gets != 3 {
		t.Fatalf("%d GETs after two polls, want 3", gets)
	}
	attached := va.DeepCopy()
	attached.Status.Attached = true
	if err := a.Tracker().Update(storagev1.SchemeGroupVersion.WithResource("volumeattachments"), attached, ""); err != nil {
		t.Fatal(err)
	}
	fc.Step(pollFirst * 9 / 4)
	if r := recv(t, changes, "the attachment announced"); r != vaRef {
		t.Fatalf("OnChange(%s)", r)
	}
	if gets := waitGets(t, a, fc); gets != 4 {
		t.Fatalf("%d GETs, want 4", gets)
	}
	fc.Step(pollMax) // no quick read any more
	if gets := waitGets(t, a, fc); gets != 4 {
		t.Fatalf("%d GETs: an attached VolumeAttachment was polled", gets)
	}
	fc.Step(time.Minute - pollMax)
	if gets := waitGets(t, a, fc); gets != 5 {
		t.Fatalf("%d GETs after the TTL, want 5", gets)
	}
	if o := get(t, c, vaRef); !o.(*storagev1.VolumeAttachment).Status.Attached {
		t.Error("Get: want the attached VolumeAttachment")
	}
}

// TestGetOnlyFailures: a first GET refused is Peek's answer, announced;
// its retry waits for the backoff and its success is announced; a later
// failing GET keeps the known object and announces nothing; a missing
// object is NotFound; a selecting Ref of a GET-only kind is refused.
func TestGetOnlyFailures(t *testing.T) {
	a := newAPI(claim(""))
	var mu sync.Mutex
	fail := true
	a.PrependReactor("get", "persistentvolumeclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if fail {
			return true, nil, apierrors.NewForbidden(corev1.Resource("persistentvolumeclaims"), "c", errors.New("no relationship found"))
		}
		return false, nil, nil
	})
	setFail := func(v bool) { mu.Lock(); fail = v; mu.Unlock() }
	g := newGate(a, "persistentvolumeclaims")
	fc := newFakeClock()
	c, changes := start(t, a, Config{Clock: fc, TTL: time.Minute})
	c.Hold("pod", pvcRef)
	if _, err := c.Peek(pvcRef); !errors.Is(err, ErrNotAnswered) {
		t.Fatalf("Peek before the first answer: %v", err)
	}
	close(g.open)
	if r := recv(t, changes, "the refusal announced"); r != pvcRef {
		t.Fatalf("OnChange(%s)", r)
	}
	if _, err := c.Peek(pvcRef); !apierrors.IsForbidden(err) {
		t.Fatalf("Peek after a refused GET: %v, want Forbidden", err)
	}
	eventually(t, "the backoff", fc.HasWaiters)
	setFail(false)
	fc.Step(retry.Initial)
	recv(t, changes, "the claim announced")
	if o, err := c.Peek(pvcRef); err != nil || nameOf(o) != "c" {
		t.Fatalf("Peek after the retry: %v, %v", o, err)
	}
	eventually(t, "the refresh wait", fc.HasWaiters)
	setFail(true)
	fc.Step(time.Minute)
	eventually(t, "the failed refresh's backoff", fc.HasWaiters)
	if o, err := c.Peek(pvcRef); err != nil || nameOf(o) != "c" {
		t.Errorf("Peek after a failed refresh: %v, %v; want the known claim", o, err)
	}
	select {
	case r := <-changes:
		t.Errorf("OnChange(%s) for a failed refresh of a known object", r)
	default:
	}

	missing := Ref{Kind: PersistentVolume, Name: "gone"}
	c.Hold("pod", pvcRef, missing)
	if _, err := c.Get(context.Background(), missing); !apierrors.IsNotFound(err) {
		t.Errorf("Get of a missing volume: %v, want NotFound", err)
	}
	sel := Ref{Kind: PersistentVolumeClaim, Namespace: "ns", Labels: "a=b"}
	c.Hold("pod", sel)
	if _, err := c.List(context.Background(), sel); !isInvalid(err) {
		t.Errorf("List of a selecting claim ref: %v, want invalid", err)
	}
}
