package podcert

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	k8scache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	testclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volumemanager/internal/podcert/podcerttest"
)

const (
	nodeName = "node1"
	nodeUID  = types.UID("node-uid")
	saUID    = types.UID("sa-uid")
	signer   = "example.com/signer"
)

var (
	t0      = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	testPod = podvol.PodRef{UID: "pod-uid", Namespace: "ns", Name: "pod", ServiceAccount: "sa"}
)

// harness runs a Manager against a fake clientset whose reactor names the
// requests (req-1, req-2, ...: the fake does not do generateName) and
// records each with the fake clock's time at its creation.
type harness struct {
	t       *testing.T
	m       *Manager
	client  *fake.Clientset
	clock   *testclock.FakeClock
	events  *record.FakeRecorder
	changes chan types.UID
	ctx     context.Context

	mu      sync.Mutex
	created []createdPCR
	armedAt []time.Time
	hide    int           // how many of the next requests are answered but not stored
	notify  chan struct{} // a request was created or seen, or the loop waits
}

type createdPCR struct {
	pcr *certificatesv1.PodCertificateRequest
	at  time.Time
}

// newHarness starts a Manager; objects are added to the clientset (by
// default the node's Node and the pod's ServiceAccount).
func newHarness(t *testing.T, objects ...runtime.Object) *harness {
	t.Helper()
	if objects == nil {
		objects = []runtime.Object{
			&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, UID: nodeUID}},
			&v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "sa", UID: saUID}},
		}
	}
	h := &harness{
		t:       t,
		client:  fake.NewClientset(objects...),
		clock:   testclock.NewFakeClock(t0),
		events:  record.NewFakeRecorder(100),
		changes: make(chan types.UID, 100),
		notify:  make(chan struct{}, 1),
	}
	h.client.PrependReactor("create", "podcertificaterequests", func(a k8stesting.Action) (bool, runtime.Object, error) {
		pcr := a.(k8stesting.CreateAction).GetObject().(*certificatesv1.PodCertificateRequest)
		h.mu.Lock()
		pcr.Name = fmt.Sprintf("req-%d", len(h.created)+1)
		h.created = append(h.created, createdPCR{pcr.DeepCopy(), h.clock.Now()})
		hide := h.hide > 0
		if hide {
			h.hide--
		}
		h.mu.Unlock()
		h.poke()
		if hide {
			return true, pcr, nil // answered, never stored: never seen
		}
		return false, nil, nil // stored by the default reactor
	})
	m, err := New(Config{
		Client: h.client, Clock: h.clock, NodeName: nodeName, Recorder: h.events,
		OnChange: func(pod types.UID) { h.changes <- pod },
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	m.jitter = func(time.Duration) time.Duration { return 0 }
	m.waiting = func(at time.Time) {
		h.mu.Lock()
		h.armedAt = append(h.armedAt, at)
		h.mu.Unlock()
		h.poke()
	}
	h.m = m
	if _, err := m.informer.AddEventHandler(k8scache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { h.poke() },
		UpdateFunc: func(any, any) { h.poke() },
		DeleteFunc: func(any) { h.poke() },
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	h.ctx = ctx
	done := make(chan struct{})
	go func() { defer close(done); m.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return h
}

func (h *harness) poke() {
	select {
	case h.notify <- struct{}{}:
	default:
	}
}

// waitFor waits until cond, checked under h.mu, holds.
func (h *harness) waitFor(what string, cond func() bool) {
	h.t.Helper()
	for {
		h.mu.Lock()
		ok := cond()
		h.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-h.notify:
		case <-h.ctx.Done():
			h.t.Fatalf("gave up waiting for %s", what)
		}
	}
}

// waitCreated waits for the n-th request and returns it.
func (h *harness) waitCreated(n int) createdPCR {
	h.t.Helper()
	h.waitFor(fmt.Sprintf("request %d", n), func() bool { return len(h.created) >= n })
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.created[n-1]
}

// waitPending waits for the n-th request to be created, recorded as
// pending by the Manager and seen by its informer (in a cluster, long
// before the 10 minutes after which an unseen request is made again).
func (h *harness) waitPending(n int) createdPCR {
	h.t.Helper()
	c := h.waitCreated(n)
	h.waitFor(fmt.Sprintf("request %d pending and seen", n), func() bool {
		h.m.mu.Lock()
		_, pending := h.m.pending["ns/"+c.pcr.Name]
		h.m.mu.Unlock()
		_, seen, _ := h.m.informer.GetStore().GetByKey("ns/" + c.pcr.Name)
		return pending && seen
	})
	return c
}

// stepTo waits until the loop waits for at, then moves the clock there.
func (h *harness) stepTo(at time.Time) {
	h.t.Helper()
	h.waitFor("a timer at "+at.String(), func() bool {
		return len(h.armedAt) > 0 && h.armedAt[len(h.armedAt)-1].Equal(at)
	})
	h.clock.SetTime(at)
}

// waitChange waits for OnChange about pod.
func (h *harness) waitChange(pod types.UID) {
	h.t.Helper()
	select {
	case got := <-h.changes:
		if got != pod {
			h.t.Fatalf("OnChange(%s), want %s", got, pod)
		}
	case <-h.ctx.Done():
		h.t.Fatalf("gave up waiting for OnChange(%s)", pod)
	}
}

// credentials asks for the credential of source index of volume "certs".
func (h *harness) credentials(pod podvol.PodRef, index int, src *v1.PodCertificateProjection) (Credential, error) {
	return h.m.Credentials(h.ctx, Request{Pod: pod, Volume: "certs", SourceIndex: index, Source: src})
}

// setStatus sets the status of request name as a signer would.
func (h *harness) setStatus(name string, status certificatesv1.PodCertificateRequestStatus) {
	h.t.Helper()
	pcrs := h.client.CertificatesV1().PodCertificateRequests("ns")
	pcr, err := pcrs.Get(h.ctx, name, metav1.GetOptions{})
	if err != nil {
		h.t.Fatalf("getting request %s: %v", name, err)
	}
	pcr.Status = status
	if _, err := pcrs.UpdateStatus(h.ctx, pcr, metav1.UpdateOptions{}); err != nil {
		h.t.Fatalf("updating the status of request %s: %v", name, err)
	}
}

// condition is a status with one condition of type typ.
func condition(typ, reason, message string) certificatesv1.PodCertificateRequestStatus {
	return podcerttest.Condition(typ, reason, message, t0)
}

// issued is the status of pcr issued by a test CA (podcerttest.Issue, from
// t0), and what the Manager must project as the chain.
func issued(t *testing.T, pcr *certificatesv1.PodCertificateRequest, beginRefreshAt, notAfter time.Time) (certificatesv1.PodCertificateRequestStatus, []byte) {
	t.Helper()
	st, chain, err := podcerttest.Issue(pcr, t0, beginRefreshAt, notAfter)
	if err != nil {
		t.Fatal(err)
	}
	return st, chain
}

// srcOf is a podCertificate source of signer with keyType.
func srcOf(keyType string) *v1.PodCertificateProjection {
	return &v1.PodCertificateProjection{
		SignerName: signer, KeyType: keyType, MaxExpirationSeconds: ptr.To[int32](3600),
		CredentialBundlePath: "bundle.pem", UserAnnotations: map[string]string{"example.com/role": "web"},
	}
}
