package volumemanager

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/mount-utils"
	testclock "k8s.io/utils/clock/testing"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// fetchHarness drives a fetcher step by step: no workers, the test takes
// each due GET from the queue (fetchNext) and moves the fake clock.
type fetchHarness struct {
	t      *testing.T
	f      *fetcher
	client *fake.Clientset
	clock  *testclock.FakeClock
	mu     sync.Mutex
	said   []string // announcements: "claim ns/c", "attachment va"
}

func newFetchHarness(t *testing.T, objs ...runtime.Object) *fetchHarness {
	h := &fetchHarness{t: t, client: fake.NewClientset(objs...), clock: testclock.NewFakeClock(time.Unix(1000, 0))}
	h.f = newFetcher(h.client, h.clock, time.Minute)
	h.f.retry.Rand = func() float64 { return 0 } // retries exactly on the doubling
	h.f.claim = func(k string) { h.say("claim " + k) }
	h.f.attachment = func(n string) { h.say("attachment " + n) }
	t.Cleanup(h.f.queue.ShutDown)
	return h
}

func (h *fetchHarness) say(s string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.said = append(h.said, s)
}

// announced returns and clears the announcements, sorted.
func (h *fetchHarness) announced() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := h.said
	h.said = nil
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// nudge wakes the delaying queue's waiting loop so that it reads the
// clock again. That loop reads the time and then arms a timer for the
// next item relative to what it read: a Step of the fake clock in between
// leaves the timer armed too late by the step, and the item the step made
// due is never handed out (2 of 10 race runs under load). A real clock does
// not jump, so only the tests have this race. A delayed add of the
// sentinel key wakes the loop, which hands out everything due by now.
func (h *fetchHarness) nudge() { h.f.queue.AddAfter(fetchKey{}, time.Nanosecond) }

// fetchNext runs the next GET the queue hands out (waiting for a delayed
// one that the clock has made due) and returns its key.
func (h *fetchHarness) fetchNext() fetchKey {
	h.t.Helper()
	h.nudge()
	got := make(chan fetchKey, 1)
	go func() {
		for {
			k, quit := h.f.queue.Get()
			if quit {
				return
			}
			if k == (fetchKey{}) { // nudge's sentinel
				h.f.queue.Done(k)
				continue
			}
			got <- k
			return
		}
	}()
	select {
	case k := <-got:
		h.f.fetch(context.Background(), k)
		h.f.queue.Done(k)
		return k
	case <-time.After(10 * time.Second):
		h.t.Fatal("no fetch became due")
		return fetchKey{}
	}
}

// requests counts the client's requests by "verb resource".
func (h *fetchHarness) requests() map[string]int {
	out := map[string]int{}
	for _, a := range h.client.Actions() {
		out[a.GetVerb()+" "+a.GetResource().Resource]++
	}
	return out
}

// TestFetcherGetsWhatIsRead: a read of an unknown claim says it is being
// fetched and queues one GET; the answer is announced, the claim's volume
// is fetched at once; both are then served from the cache without a
// request, and refreshed once a refresh period later. No LIST or WATCH.
func TestFetcherGetsWhatIsRead(t *testing.T) {
	pvc, pv := csitest.BoundClaim("ns", "c", "d.example.com", "h")
	h := newFetchHarness(t, pvc, pv)
	l := fetchedPVCs{h.f}.PersistentVolumeClaims("ns")

	if _, err := l.Get("c"); err == nil || !strings.Contains(err.Error(), "PersistentVolumeClaim ns/c: being fetched") {
		t.Fatalf("first read: %v, want 'being fetched'", err)
	}
	if k := h.fetchNext(); k != (fetchKey{kindPVC, "ns", "c"}) {
		t.Fatalf("fetched %v first", k)
	}
	if got := h.announced(); got != "claim ns/c" {
		t.Fatalf("announced %q", got)
	}
	if k := h.fetchNext(); k != (fetchKey{kind: kindPV, name: pv.Name}) {
		t.Fatalf("fetched %v, want the claim's volume", k)
	}
	if got := h.announced(); got != "claim ns/c" {
		t.Fatalf("after the volume: announced %q, want the claim bound to it", got)
	}
	for range 3 {
		if got, err := l.Get("c"); err != nil || got.Name != "c" {
			t.Fatalf("cached read: %v %v", got, err)
		}
		if got, err := (fetchedPVs{h.f}).Get(pv.Name); err != nil || got.Name != pv.Name {
			t.Fatalf("cached read of the volume: %v %v", got, err)
		}
	}
	if got, want := h.requests(), map[string]int{"get persistentvolumeclaims": 1, "get persistentvolumes": 1}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("requests %v, want %v", got, want)
	}

	// A refresh period later both are fetched again; the changed claim is
	// announced, the unchanged volume is not.
	pvc.Labels = map[string]string{"changed": "yes"}
	if _, err := h.client.CoreV1().PersistentVolumeClaims("ns").Update(context.Background(), pvc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.clock.Step(time.Minute)
	h.fetchNext()
	h.fetchNext()
	if got := h.announced(); got != "claim ns/c" {
		t.Fatalf("after the refresh: announced %q, want only the changed claim", got)
	}
	if got, _ := l.Get("c"); got.Labels["changed"] != "yes" {
		t.Fatalf("cached claim %v, want the refreshed one", got.Labels)
	}
	for _, a := range h.client.Actions() {
		if v := a.GetVerb(); v == "list" || v == "watch" {
			t.Errorf("%s %s: node-restricted mode must not list or watch", v, a.GetResource().Resource)
		}
	}
}

// TestFetcherErrors: NotFound is served as NotFound; another error is
// served with the object named, retried with backoff (500 ms first), and
// does not replace an object already known.
func TestFetcherErrors(t *testing.T) {
	pvc, _ := csitest.BoundClaim("ns", "c", "d.example.com", "h")
	h := newFetchHarness(t, pvc)
	l := fetchedPVCs{h.f}.PersistentVolumeClaims("ns")

	_, _ = l.Get("gone")
	h.fetchNext()
	if _, err := l.Get("gone"); !apierrors.IsNotFound(err) {
		t.Fatalf("missing claim: %v, want NotFound", err)
	}

	var fail bool
	var mu sync.Mutex
	h.client.PrependReactor("get", "persistentvolumeclaims", func(clienttesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if fail {
			return true, nil, apierrors.NewForbidden(v1.Resource("persistentvolumeclaims"), "c", errors.New("no relationship found"))
		}
		return false, nil, nil
	})
	mu.Lock()
	fail = true
	mu.Unlock()
	_, _ = l.Get("c")
	h.fetchNext()
	_, err := l.Get("c")
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "get PersistentVolumeClaim ns/c") {
		t.Fatalf("forbidden claim: %v, want Forbidden naming the claim", err)
	}
	h.clock.Step(fetchRetry.Initial)
	if k := h.fetchNext(); k.name != "c" {
		t.Fatalf("retried %v", k)
	}
	mu.Lock()
	fail = false
	mu.Unlock()
	h.clock.Step(2 * fetchRetry.Initial)
	h.fetchNext()
	if got, err := l.Get("c"); err != nil || got.Name != "c" {
		t.Fatalf("after the error cleared: %v %v", got, err)
	}
	h.fetchNext() // its volume (not found here)
	h.announced()

	// Known now: a failing refresh keeps it and announces nothing.
	mu.Lock()
	fail = true
	mu.Unlock()
	h.clock.Step(time.Minute)
	for range 3 { // "gone", the claim, the volume
		h.fetchNext()
	}
	if got, err := l.Get("c"); err != nil || got.Name != "c" {
		t.Fatalf("known claim after a failed refresh: %v %v, want it kept", got, err)
	}
	if got := h.announced(); got != "" {
		t.Fatalf("a failed refresh announced %q", got)
	}
}

// TestFetcherPollsAttachment: a VolumeAttachment not attached yet is
// fetched again after 1 s, then 1.5 s, ...; its attachment is announced
// at the next poll; then it is refreshed only every refresh period.
func TestFetcherPollsAttachment(t *testing.T) {
	va := csitest.VolumeAttachment("va-1", "d.example.com", "pv-1", node, false)
	h := newFetchHarness(t, va)
	l := fetchedVAs{h.f}
	_, _ = l.Get("va-1")
	h.fetchNext()
	if got := h.announced(); got != "attachment va-1" {
		t.Fatalf("announced %q", got)
	}
	h.clock.Step(pollFirst)
	h.fetchNext()
	h.clock.Step(pollFirst * 3 / 2)
	h.fetchNext()
	if got := h.announced(); got != "" {
		t.Fatalf("unchanged polls announced %q", got)
	}
	va.Status.Attached = true
	if _, err := h.client.StorageV1().VolumeAttachments().UpdateStatus(context.Background(), va, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.clock.Step(pollFirst * 9 / 4)
	h.fetchNext()
	if got := h.announced(); got != "attachment va-1" {
		t.Fatalf("attached: announced %q", got)
	}
	if got, err := l.Get("va-1"); err != nil || !got.Status.Attached {
		t.Fatalf("cached attachment %v %v", got, err)
	}
	if n := h.requests()["get volumeattachments"]; n != 4 {
		t.Fatalf("%d GETs, want 4 (first, two polls, the attached one)", n)
	}
	h.clock.Step(pollMax) // no poll is due any more: only the refresh
	h.clock.Step(time.Minute)
	h.fetchNext()
	if n := h.requests()["get volumeattachments"]; n != 5 {
		t.Fatalf("%d GETs, want 5", n)
	}
}

// TestFetcherEvicts: an object not read for evictPeriods refresh periods
// is dropped at its next refresh without a GET; a later read fetches it
// again.
func TestFetcherEvicts(t *testing.T) {
	pvc, _ := csitest.BoundClaim("ns", "c", "d.example.com", "h")
	pvc.Spec.VolumeName = ""
	h := newFetchHarness(t, pvc)
	l := fetchedPVCs{h.f}.PersistentVolumeClaims("ns")
	_, _ = l.Get("c")
	h.fetchNext()
	for i := 1; i <= evictPeriods; i++ {
		h.clock.Step(time.Minute)
		h.fetchNext()
	}
	h.clock.Step(time.Minute + time.Second)
	h.fetchNext() // dropped, no GET
	if n := h.requests()["get persistentvolumeclaims"]; n != 1+evictPeriods {
		t.Fatalf("%d GETs, want %d", n, 1+evictPeriods)
	}
	if _, err := l.Get("c"); err == nil || !strings.Contains(err.Error(), "being fetched") {
		t.Fatalf("read after eviction: %v, want 'being fetched'", err)
	}
}

// restrictedClient is a fake clientset on which listing or watching claims,
// volumes and attachments is forbidden, as for a node under the Node
// authorizer.
func restrictedClient() *fake.Clientset {
	c := fake.NewClientset()
	for _, res := range []string{"persistentvolumeclaims", "persistentvolumes", "volumeattachments"} {
		for _, verb := range []string{"list", "watch"} {
			c.PrependReactor(verb, res, func(a clienttesting.Action) (bool, runtime.Object, error) {
				return true, nil, apierrors.NewForbidden(v1.Resource(res), "", fmt.Errorf("node may not %s", verb))
			})
		}
	}
	return c
}

// TestNodeRestrictedMounts: with Config.NodeRestricted, pods mount and
// unmount with one GET of each claim and volume (and polls of a
// VolumeAttachment until it is attached), and never a LIST or WATCH of
// them.
func TestNodeRestrictedMounts(t *testing.T) {
	e := newEnv(t, envOptions{nodeRestricted: true, client: restrictedClient()})
	var pods []*v1.Pod
	for i := range 3 {
		name := fmt.Sprintf("vol-%d", i)
		e.claim(name)
		pods = append(pods, csitest.Pod("ns", "p-"+name, csitest.WithPVC("data", name, false)))
	}
	for _, p := range pods {
		if err := e.mount(p, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range pods {
		e.unmount(p)
	}
	gets := map[string]int{}
	for _, a := range e.client.Actions() {
		r := a.GetResource().Resource
		if r != "persistentvolumeclaims" && r != "persistentvolumes" && r != "volumeattachments" {
			continue
		}
		switch a.GetVerb() {
		case "get":
			gets[r]++
		case "create":
		default:
			t.Errorf("%s %s in node-restricted mode", a.GetVerb(), r)
		}
	}
	if want := map[string]int{"persistentvolumeclaims": 3, "persistentvolumes": 3}; fmt.Sprint(gets) != fmt.Sprint(want) {
		t.Errorf("GETs %v, want %v: one per claim and volume", gets, want)
	}
}

// TestNodeRestrictedAttach: a VolumeAttachment is polled, not watched:
// the volume is staged once the attacher has set status.attached, and an
// attach error reaches WaitForAttachAndMount.
func TestNodeRestrictedAttach(t *testing.T) {
	e := newEnv(t, envOptions{nodeRestricted: true, client: restrictedClient(), attachRequired: true})
	e.claim("vol")
	vaName := csitest.AttachmentName("handle-vol", e.drv.DriverName(), node)
	va := csitest.VolumeAttachment(vaName, e.drv.DriverName(), "pv-vol", node, false)
	va.Status.AttachError = &storagev1.VolumeError{Message: "disk is on fire"}
	e.create(va)
	pod := csitest.Pod("ns", "p", csitest.WithPVC("data", "vol", false))
	if err := e.mount(pod, 500*time.Millisecond); err == nil || !strings.Contains(err.Error(), "disk is on fire") {
		t.Fatalf("WaitForAttachAndMount = %v, want the attach error", err)
	}
	if n := e.drv.Calls("NodeStageVolume"); n != 0 {
		t.Fatalf("%d NodeStageVolume before the attachment", n)
	}
	va.Status = storagev1.VolumeAttachmentStatus{Attached: true}
	if _, err := e.client.StorageV1().VolumeAttachments().UpdateStatus(context.Background(), va, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.mount(pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	e.unmount(pod)
}

// TestForbiddenListNamesNodeRestricted: without Config.NodeRestricted, a
// forbidden list of claims says which mode a node's credentials need.
func TestForbiddenListNamesNodeRestricted(t *testing.T) {
	vm, err := New(Config{NodeName: node, KubeClient: restrictedClient(), RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- vm.Run(ctx) }()
	defer func() { cancel(); <-done }()
	eventually(t, "the list error recorded", func() bool { return len(vm.listErrs.get()) > 0 })
	waitCtx, waitCancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer waitCancel()
	err = vm.WaitForAttachAndMount(waitCtx, csitest.Pod("ns", "p", csitest.WithPVC("data", "vol", false)))
	for _, want := range []string{"forbidden", "Config.NodeRestricted"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not say %q", err, want)
		}
	}
}

// TestNodeRestrictedKeepsWhatPodsUse: the claim and volume of a running pod
// stay cached and are refreshed at every resync, beyond the eviction age,
// because the resync reads them again (it resolves every known pod again,
// and the plan of a mounted volume reads its claim for a pending
// expansion: either read keeps them).
func TestNodeRestrictedKeepsWhatPodsUse(t *testing.T) {
	const period = 20 * time.Millisecond
	e := newEnv(t, envOptions{nodeRestricted: true, client: restrictedClient(), resyncPeriod: period})
	e.claim("vol")
	pod := csitest.Pod("ns", "p", csitest.WithPVC("data", "vol", false))
	if err := e.mount(pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	gets := func() int {
		n := 0
		for _, a := range e.client.Actions() {
			if a.GetVerb() == "get" && a.GetResource().Resource == "persistentvolumeclaims" {
				n++
			}
		}
		return n
	}
	// Evicted after evictPeriods unread periods, the claim would be fetched
	// no more than 1+evictPeriods times.
	eventually(t, "the claim refreshed past the eviction age", func() bool { return gets() >= 3*evictPeriods })
	if _, err := e.vm.fetcher.read(fetchKey{kind: kindPVC, namespace: "ns", name: "vol"}); err != nil {
		t.Fatalf("claim of a running pod: %v, want it cached", err)
	}
	e.unmount(pod)
}

// TestFetcherRetryBackoff: a failed GET is retried after the API retry
// policy's wait (500 ms doubling to 1 min, lengthened by its jitter), and
// a GET that succeeds goes back to the refresh period.
func TestFetcherRetryBackoff(t *testing.T) {
	h := newFetchHarness(t)
	h.f.retry.Rand = func() float64 { return 0.5 } // a tenth longer
	k := fetchKey{kind: kindPVC, namespace: "ns", name: "c"}
	e := &fetched{}
	failed := apierrors.NewServiceUnavailable("apiserver down")
	for i, want := range []time.Duration{550 * time.Millisecond, 1100 * time.Millisecond, 2200 * time.Millisecond} {
		if ans := h.f.store(k, e, nil, failed); !ans.failing || ans.next != want {
			t.Fatalf("failure %d: failing %v, next %v; want %v", i+1, ans.failing, ans.next, want)
		}
	}
	for range 10 {
		h.f.store(k, e, nil, failed)
	}
	if ans := h.f.store(k, e, nil, failed); ans.next != 66*time.Second {
		t.Errorf("after many failures: next %v, want the 1 min cap plus a tenth", ans.next)
	}
	pvc, _ := csitest.BoundClaim("ns", "c", "d.example.com", "h")
	if ans := h.f.store(k, e, pvc, nil); ans.failing || ans.next != time.Minute {
		t.Errorf("success: failing %v, next %v; want the refresh", ans.failing, ans.next)
	}
	if ans := h.f.store(k, e, nil, failed); ans.next != 550*time.Millisecond {
		t.Errorf("failure after a success: next %v, want 550ms again", ans.next)
	}
}
