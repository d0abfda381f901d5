package volumemanager

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/nodevol/nodevol/internal/backoff"
)

// In node-restricted mode (Config.NodeRestricted) the node may read
// PersistentVolumeClaims, PersistentVolumes and VolumeAttachments only one
// at a time, with GET, and only those of pods bound to it: the Node
// authorizer forbids listing and watching them. The fetcher serves the
// resolver and the CSI plugin from a cache filled by GETs instead of from
// informers:
//
//   - a read of an object not in the cache returns at once with an error
//     that says it is being fetched, and queues one GET; the answer is
//     announced like an informer event (the claim's pods are resolved
//     again, the volume waiting for the VolumeAttachment is retried);
//   - a claim bound to a volume fetches the volume at once too;
//   - an object read in the last evictAfter is fetched again every
//     refresh (Config.ResyncPeriod), a VolumeAttachment not yet attached
//     every second at first, then less often (up to every 10 s), as the
//     kubelet polls it; a change is announced;
//   - a failed GET is retried with backoff (fetchRetry: 500 ms doubling to
//     1 min, with the jitter of API retries) and logged once per
//     new error at the default level; an object already known is kept
//     (an API error says nothing about it);
//   - an object not read for evictAfter is dropped without a GET.
//
// The loop reads every known pod's claims at each resync in this mode, so
// the objects of running pods stay cached.

// Kinds the fetcher serves.
const (
	kindPVC uint8 = iota
	kindPV
	kindVA
)

var fetchedResources = [...]schema.GroupResource{
	kindPVC: v1.Resource("persistentvolumeclaims"),
	kindPV:  v1.Resource("persistentvolumes"),
	kindVA:  storagev1.Resource("volumeattachments"),
}

var fetchedKinds = [...]string{kindPVC: "PersistentVolumeClaim", kindPV: "PersistentVolume", kindVA: "VolumeAttachment"}

// fetchKey names one object: namespace empty for PVs and VolumeAttachments.
type fetchKey struct {
	kind      uint8
	namespace string
	name      string
}

func (k fetchKey) String() string {
	if k.namespace == "" {
		return fetchedKinds[k.kind] + " " + k.name
	}
	return fetchedKinds[k.kind] + " " + k.namespace + "/" + k.name
}

// fetched is one cached object.
type fetched struct {
	obj      metav1.Object // nil: not found, or no answer yet
	err      error         // the last GET's error while no object is known
	answered bool          // a GET has returned
	readAt   time.Time     // last read by the resolver or the plugin
	poll     time.Duration // the next quick poll (VolumeAttachments not attached)
	failures int           // GETs failed in a row, for the retry's backoff
	// claims are the "namespace/name" keys of the claims bound to this PV,
	// announced when it changes (its claimRef may be empty).
	claims map[string]struct{}
}

// Fetch timing.
const (
	fetchTimeout = 30 * time.Second
	pollFirst    = time.Second
	pollMax      = 10 * time.Second
	fetchWorkers = 4
	evictPeriods = 3 // an object unread for this many refresh periods is dropped
)

// fetchRetry is the backoff of a failed GET: 500 ms doubling to 1 min, with
// the jitter of API server retries, so that the nodes of a cluster do not
// all retry at once after an outage.
var fetchRetry = backoff.Policy{Initial: 500 * time.Millisecond, Max: time.Minute, Jitter: backoff.APIJitter}

// fetcher is the GET-based cache of node-restricted mode.
type fetcher struct {
	client  kubernetes.Interface
	clock   clock.WithTicker
	refresh time.Duration
	// changed announces a changed object (not under the lock):
	// claims(key) for a claim and the claims bound to a volume,
	// attachment(name) for a VolumeAttachment.
	claim      func(key string)
	attachment func(name string)

	mu      sync.Mutex
	entries map[fetchKey]*fetched
	queue   workqueue.TypedDelayingInterface[fetchKey]
	// retry is fetchRetry; tests fix its jitter.
	retry backoff.Policy
	gets  atomic.Int64 // GETs sent, for tests and the docs' numbers
}

func newFetcher(client kubernetes.Interface, clk clock.WithTicker, refresh time.Duration) *fetcher {
	return &fetcher{
		client:  client,
		clock:   clk,
		refresh: refresh,
		entries: map[fetchKey]*fetched{},
		queue: workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[fetchKey]{
			Name: "", Clock: clk,
		}),
		retry:      fetchRetry,
		claim:      func(string) {},
		attachment: func(string) {},
	}
}

// run fetches until ctx ends.
func (f *fetcher) run(ctx context.Context) {
	var wg sync.WaitGroup
	for range fetchWorkers {
		wg.Go(func() {
			for {
				k, quit := f.queue.Get()
				if quit {
					return
				}
				f.fetch(ctx, k)
				f.queue.Done(k)
			}
		})
	}
	<-ctx.Done()
	f.queue.ShutDown()
	wg.Wait()
}

// read returns the cached object, NotFound, the last GET's error, or, for
// an object never fetched, an error saying so (and queues its GET).
func (f *fetcher) read(k fetchKey) (metav1.Object, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e := f.entry(k)
	e.readAt = f.clock.Now()
	switch {
	case e.obj != nil:
		return e.obj, nil
	case !e.answered:
		return nil, fmt.Errorf("%s: being fetched from the API server (node-restricted mode: no informer)", k)
	case e.err != nil:
		return nil, e.err
	}
	return nil, apierrors.NewNotFound(fetchedResources[k.kind], k.name)
}

// entry returns k's entry, creating it and queueing its first GET when
// missing. f.mu is held.
func (f *fetcher) entry(k fetchKey) *fetched {
	e := f.entries[k]
	if e == nil {
		e = &fetched{readAt: f.clock.Now()}
		f.entries[k] = e
		f.queue.Add(k)
	}
	return e
}

// fetch GETs one object, stores the answer, announces a change and
// schedules the next GET (or drops an object nobody reads any more).
func (f *fetcher) fetch(ctx context.Context, k fetchKey) {
	now := f.clock.Now()
	f.mu.Lock()
	e := f.entries[k]
	if e != nil && now.Sub(e.readAt) > evictPeriods*f.refresh {
		delete(f.entries, k)
		e = nil
	}
	f.mu.Unlock()
	if e == nil {
		return
	}

	gctx, cancel := context.WithTimeout(ctx, fetchTimeout)
	obj, err := f.get(gctx, k)
	cancel()
	if ctx.Err() != nil {
		return // stopping: the answer may be a cancellation
	}
	f.gets.Add(1)

	f.mu.Lock()
	ans := f.store(k, e, obj, err)
	f.mu.Unlock()

	if ans.failing && ans.changed {
		klog.FromContext(ctx).Error(ans.err, "Fetching failed (node-restricted mode)", "object", k.String(), "retryAfter", ans.next)
	}
	f.queue.AddAfter(k, ans.next)
	if ans.changed {
		f.announce(k, ans.claims)
	}
}

// answer is what one GET changed, and when to GET again.
type answer struct {
	// changed: the entry's object or error changed; failing: the GET
	// failed (err, wrapped), and is retried with backoff (next).
	changed, failing bool
	err              error
	// claims are the claims ("namespace/name") a PV answer concerns.
	claims []string
	// next is when to GET again: the refresh or the poll, or after a
	// failure the retry's backoff.
	next time.Duration
}

// store records the answer to a GET of k in its entry e, queues the PV a
// claim is bound to, and sets the next GET of an attachment not attached
// yet (polled, slower and slower). f.mu is held.
func (f *fetcher) store(k fetchKey, e *fetched, obj metav1.Object, err error) answer {
	var ans answer
	switch {
	case err == nil:
		ans.changed = e.obj == nil || e.obj.GetResourceVersion() != obj.GetResourceVersion() ||
			obj.GetResourceVersion() == "" && !equality.Semantic.DeepEqual(e.obj, obj) // clients without versions (fakes)
		e.obj, e.err = obj, nil
	case apierrors.IsNotFound(err):
		ans.changed = !e.answered || e.obj != nil || e.err != nil
		e.obj, e.err = nil, nil
	default:
		ans.failing = true
		if !e.answered || e.err != nil { // a known answer (an object, or NotFound) is kept: the error says nothing about it
			err = fmt.Errorf("get %s: %w", k, err)
			ans.changed = !e.answered || e.err == nil || e.err.Error() != err.Error()
			e.err = err
		}
		ans.err = err
	}
	e.answered = true
	if k.kind == kindPV {
		ans.claims = pvClaims(e)
	}
	if pvc, ok := e.obj.(*v1.PersistentVolumeClaim); ok && pvc.Spec.VolumeName != "" {
		// The claim's volume is read next: fetch it now.
		pe := f.entry(fetchKey{kind: kindPV, name: pvc.Spec.VolumeName})
		if pe.claims == nil {
			pe.claims = map[string]struct{}{}
		}
		pe.claims[k.namespace+"/"+k.name] = struct{}{}
	}
	ans.next = f.refresh
	if va, ok := e.obj.(*storagev1.VolumeAttachment); k.kind == kindVA && (!ok || !va.Status.Attached) {
		switch {
		case ans.changed || e.poll == 0:
			e.poll = pollFirst
		default:
			e.poll = min(e.poll*3/2, pollMax)
		}
		ans.next = e.poll
	}
	if ans.failing {
		e.failures++
		ans.next = f.retry.Delay(e.failures)
	} else {
		e.failures = 0
	}
	return ans
}

// pvClaims are the claims a PV's entry concerns: those that read it, and
// the one its claimRef names.
func pvClaims(e *fetched) []string {
	var claims []string
	for c := range e.claims {
		claims = append(claims, c)
	}
	if pv, ok := e.obj.(*v1.PersistentVolume); ok && pv.Spec.ClaimRef != nil {
		c := pv.Spec.ClaimRef.Namespace + "/" + pv.Spec.ClaimRef.Name
		if _, seen := e.claims[c]; !seen {
			claims = append(claims, c)
		}
	}
	return claims
}

// announce tells the loop that an object changed: the pods waiting for a
// claim resolve again, a volume waiting for its attachment is retried.
func (f *fetcher) announce(k fetchKey, claims []string) {
	switch k.kind {
	case kindPVC:
		f.claim(k.namespace + "/" + k.name)
	case kindPV:
		for _, c := range claims {
			f.claim(c)
		}
	case kindVA:
		f.attachment(k.name)
	}
}

func (f *fetcher) get(ctx context.Context, k fetchKey) (metav1.Object, error) {
	opts := metav1.GetOptions{}
	switch k.kind {
	case kindPVC:
		return nonNil(f.client.CoreV1().PersistentVolumeClaims(k.namespace).Get(ctx, k.name, opts))
	case kindPV:
		return nonNil(f.client.CoreV1().PersistentVolumes().Get(ctx, k.name, opts))
	default:
		return nonNil(f.client.StorageV1().VolumeAttachments().Get(ctx, k.name, opts))
	}
}

// nonNil turns a typed nil pointer returned with an error into a nil
// interface.
func nonNil[T metav1.Object](obj T, err error) (metav1.Object, error) {
	if err != nil {
		return nil, err
	}
	return obj, nil
}

// list returns the cached objects of a kind (and namespace, unless "")
// that match sel: only what has been fetched, never a LIST.
func (f *fetcher) list(kind uint8, namespace string, sel labels.Selector) []metav1.Object {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []metav1.Object
	for k, e := range f.entries {
		if k.kind == kind && e.obj != nil && (namespace == "" || k.namespace == namespace) && sel.Matches(labels.Set(e.obj.GetLabels())) {
			out = append(out, e.obj)
		}
	}
	return out
}

// The listers over the fetcher, for the resolver and the CSI plugin.

type fetchedPVCs struct{ f *fetcher }

func (l fetchedPVCs) List(sel labels.Selector) ([]*v1.PersistentVolumeClaim, error) {
	return typed[*v1.PersistentVolumeClaim](l.f.list(kindPVC, "", sel)), nil
}

func (l fetchedPVCs) PersistentVolumeClaims(ns string) corelisters.PersistentVolumeClaimNamespaceLister {
	return fetchedNamespacedPVCs{f: l.f, ns: ns}
}

type fetchedNamespacedPVCs struct {
	f  *fetcher
	ns string
}

func (l fetchedNamespacedPVCs) List(sel labels.Selector) ([]*v1.PersistentVolumeClaim, error) {
	return typed[*v1.PersistentVolumeClaim](l.f.list(kindPVC, l.ns, sel)), nil
}

func (l fetchedNamespacedPVCs) Get(name string) (*v1.PersistentVolumeClaim, error) {
	return readTyped[*v1.PersistentVolumeClaim](l.f, fetchKey{kind: kindPVC, namespace: l.ns, name: name})
}

type fetchedPVs struct{ f *fetcher }

func (l fetchedPVs) List(sel labels.Selector) ([]*v1.PersistentVolume, error) {
	return typed[*v1.PersistentVolume](l.f.list(kindPV, "", sel)), nil
}

func (l fetchedPVs) Get(name string) (*v1.PersistentVolume, error) {
	return readTyped[*v1.PersistentVolume](l.f, fetchKey{kind: kindPV, name: name})
}

type fetchedVAs struct{ f *fetcher }

func (l fetchedVAs) List(sel labels.Selector) ([]*storagev1.VolumeAttachment, error) {
	return typed[*storagev1.VolumeAttachment](l.f.list(kindVA, "", sel)), nil
}

func (l fetchedVAs) Get(name string) (*storagev1.VolumeAttachment, error) {
	return readTyped[*storagev1.VolumeAttachment](l.f, fetchKey{kind: kindVA, name: name})
}

var (
	_ corelisters.PersistentVolumeClaimLister          = fetchedPVCs{}
	_ corelisters.PersistentVolumeLister               = fetchedPVs{}
	_ storagelisters.VolumeAttachmentLister            = fetchedVAs{}
	_ corelisters.PersistentVolumeClaimNamespaceLister = fetchedNamespacedPVCs{}
)

func readTyped[T metav1.Object](f *fetcher, k fetchKey) (T, error) {
	var zero T
	obj, err := f.read(k)
	if err != nil {
		return zero, err
	}
	return obj.(T), nil
}

func typed[T metav1.Object](objs []metav1.Object) []T {
	out := make([]T, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.(T))
	}
	return out
}
