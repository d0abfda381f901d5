package podcert

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/google/go-cmp/cmp"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// TestIssue: the first Credentials starts a request and is not ready; the
// request carries the pod, its service account and node with their UIDs,
// the source's fields and an empty PKCS#10 request signed by the new key;
// once issued, OnChange fires and Credentials returns that key and the
// cleaned chain.
func TestIssue(t *testing.T) {
	h := newHarness(t)
	src := srcOf(KeyTypeECDSAP256)
	if _, err := h.credentials(testPod, 2, src); !errors.Is(err, volume.ErrNotReady) || !strings.Contains(err.Error(), "credential bundle is not issued yet") {
		t.Fatalf("Credentials before issuance = %v, want not issued yet (ErrNotReady)", err)
	}
	c := h.waitPending(1)
	want := certificatesv1.PodCertificateRequestSpec{
		SignerName: signer, PodName: "pod", PodUID: "pod-uid", ServiceAccountName: "sa", ServiceAccountUID: saUID,
		NodeName: nodeName, NodeUID: nodeUID, MaxExpirationSeconds: ptr.To[int32](3600),
		StubPKCS10Request: c.pcr.Spec.StubPKCS10Request, UnverifiedUserAnnotations: map[string]string{"example.com/role": "web"},
	}
	if diff := cmp.Diff(want, c.pcr.Spec); diff != "" {
		t.Errorf("request spec (-want +got):\n%s", diff)
	}
	wantMeta := metav1.ObjectMeta{Namespace: "ns", Name: "req-1", GenerateName: "req-",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "pod", UID: "pod-uid"}}}
	if diff := cmp.Diff(wantMeta, c.pcr.ObjectMeta); diff != "" {
		t.Errorf("request metadata (-want +got):\n%s", diff)
	}
	csr, err := x509.ParseCertificateRequest(c.pcr.Spec.StubPKCS10Request)
	if err != nil {
		t.Fatalf("parsing the PKCS#10 request: %v", err)
	}
	if err := csr.CheckSignature(); err != nil {
		t.Fatalf("the proof of possession does not check: %v", err)
	}
	if _, err := h.credentials(testPod, 2, src); !errors.Is(err, volume.ErrNotReady) || !strings.Contains(err.Error(), "PodCertificateRequest ns/req-1 is pending") {
		t.Fatalf("Credentials while pending = %v, want pending (ErrNotReady)", err)
	}

	status, chain := issued(t, c.pcr, t0.Add(time.Hour), t0.Add(2*time.Hour))
	h.setStatus("req-1", status)
	h.waitChange(testPod.UID)
	cred, err := h.credentials(testPod, 2, src)
	if err != nil {
		t.Fatalf("Credentials after issuance: %v", err)
	}
	if !bytes.Equal(cred.CertificateChain, chain) {
		t.Errorf("chain = %q, want %q", cred.CertificateChain, chain)
	}
	if !parseKey(t, cred.PrivateKey).Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(csr.PublicKey) {
		t.Error("the key returned is not the key the request was signed with")
	}
	if want := string(cred.PrivateKey) + string(chain); string(cred.Bundle()) != want {
		t.Errorf("Bundle = %q, want the key then the chain", cred.Bundle())
	}
	if got := len(h.created); got != 1 {
		t.Errorf("%d requests created, want 1", got)
	}
}

// TestEnd: a denied or failed request is permanent for the source, with
// the kubelet's text, and sends the kubelet's event; a renewal denied
// takes the credential away as in the kubelet.
func TestEnd(t *testing.T) {
	for _, tt := range []struct {
		name    string
		typ     string
		renewal bool
		want    string
	}{
		{"denied", certificatesv1.PodCertificateRequestConditionTypeDenied, false, `PodCertificateRequest ns/req-1 was permanently denied: reason="UnsupportedKeyType" message="use ED25519"`},
		{"failed", certificatesv1.PodCertificateRequestConditionTypeFailed, false, `PodCertificateRequest ns/req-1 was permanently failed: reason="UnsupportedKeyType" message="use ED25519"`},
		{"renewal denied", certificatesv1.PodCertificateRequestConditionTypeDenied, true, `PodCertificateRequest ns/req-2 was permanently denied: reason="UnsupportedKeyType" message="use ED25519"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			src := srcOf(KeyTypeECDSAP384)
			_, _ = h.credentials(testPod, 0, src)
			name := h.waitCreated(1).pcr.Name
			if tt.renewal {
				status, _ := issued(t, h.waitCreated(1).pcr, t0.Add(time.Hour), t0.Add(2*time.Hour))
				h.setStatus(name, status)
				h.waitChange(testPod.UID)
				h.stepTo(t0.Add(time.Hour))
				name = h.waitPending(2).pcr.Name
			}
			h.setStatus(name, condition(tt.typ, "UnsupportedKeyType", "use ED25519"))
			h.waitChange(testPod.UID)
			_, err := h.credentials(testPod, 0, src)
			if err == nil || errors.Is(err, volume.ErrNotReady) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Credentials = %v, want a permanent error with %q", err, tt.want)
			}
			if !strings.Contains(err.Error(), `pod ns/pod volume "certs" podCertificate source 0 (signer "example.com/signer")`) {
				t.Errorf("the error does not name pod, volume and source: %v", err)
			}
			if got := <-h.events.Events; !strings.HasPrefix(got, "Warning "+tt.typ+" PodCertificateRequest ns/"+name) {
				t.Errorf("event %q, want a Warning %s about %s", got, tt.typ, name)
			}
		})
	}
}

// TestRenewal: at beginRefreshAt (no earlier) a new key is requested while
// the old credential is still handed out; when the renewal is issued,
// OnChange fires and the new key and chain are returned. A renewal that
// does not come is reported overdue 10 minutes after beginRefreshAt and
// expired at notAfter.
func TestRenewal(t *testing.T) {
	h := newHarness(t)
	src := srcOf(KeyTypeED25519)
	_, _ = h.credentials(testPod, 0, src)
	first := h.waitCreated(1)
	begin, notAfter := t0.Add(time.Hour), t0.Add(2*time.Hour)
	status, _ := issued(t, first.pcr, begin, notAfter)
	h.setStatus("req-1", status)
	h.waitChange(testPod.UID)
	old, err := h.credentials(testPod, 0, src)
	if err != nil {
		t.Fatal(err)
	}

	h.stepTo(begin)
	second := h.waitPending(2)
	if second.at.Before(begin) {
		t.Errorf("renewal requested at %v, before beginRefreshAt %v", second.at, begin)
	}
	if bytes.Equal(second.pcr.Spec.StubPKCS10Request, first.pcr.Spec.StubPKCS10Request) {
		t.Error("the renewal asks for the same key")
	}
	if cred, err := h.credentials(testPod, 0, src); err != nil || !bytes.Equal(cred.PrivateKey, old.PrivateKey) {
		t.Errorf("Credentials while renewing = %v, want the old credential", err)
	}

	h.stepTo(begin.Add(overdueAfter))
	if got, want := <-h.events.Events, "Warning CertificateOverdueForRefresh PodCertificate refresh overdue"; got != want {
		t.Errorf("event %q, want %q", got, want)
	}
	h.stepTo(notAfter)
	if got, want := <-h.events.Events, "Warning CertificateExpired PodCertificate expired"; got != want {
		t.Errorf("event %q, want %q", got, want)
	}

	status, chain := issued(t, second.pcr, notAfter.Add(time.Hour), notAfter.Add(2*time.Hour))
	h.setStatus("req-2", status)
	h.waitChange(testPod.UID)
	cred, err := h.credentials(testPod, 0, src)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(cred.PrivateKey, old.PrivateKey) || !bytes.Equal(cred.CertificateChain, chain) {
		t.Error("Credentials after the renewal is not the renewed key and chain")
	}
	csr, _ := x509.ParseCertificateRequest(second.pcr.Spec.StubPKCS10Request)
	if !parseKey(t, cred.PrivateKey).Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(csr.PublicKey) {
		t.Error("the renewed key is not the key of the renewal request")
	}
	h.stepTo(notAfter.Add(time.Hour))
	h.waitCreated(3)
}

// TestForget: Forget drops the pod's sources and pending requests; asked
// again, the source starts from a new request.
func TestForget(t *testing.T) {
	h := newHarness(t)
	other := podvol.PodRef{UID: "other-uid", Namespace: "ns", Name: "other", ServiceAccount: "sa"}
	_, _ = h.credentials(testPod, 0, srcOf(KeyTypeECDSAP256))
	h.waitCreated(1)
	_, _ = h.credentials(other, 0, srcOf(KeyTypeECDSAP256))
	h.waitCreated(2)
	h.waitFor("both pending", func() bool {
		h.m.mu.Lock()
		defer h.m.mu.Unlock()
		return len(h.m.pending) == 2
	})

	h.m.Forget(testPod.UID)
	h.m.mu.Lock()
	recs, pending := len(h.m.recs), len(h.m.pending)
	_, left := h.m.pending["ns/"+h.created[1].pcr.Name]
	h.m.mu.Unlock()
	if recs != 1 || pending != 1 || !left {
		t.Errorf("after Forget: %d sources, %d pending, other pod's left %v; want 1, 1, true", recs, pending, left)
	}
	if _, err := h.credentials(testPod, 0, srcOf(KeyTypeECDSAP256)); !errors.Is(err, volume.ErrNotReady) {
		t.Fatalf("Credentials after Forget = %v, want not ready", err)
	}
	if c := h.waitCreated(3); c.pcr.Spec.PodUID != testPod.UID {
		t.Errorf("third request for pod %s, want %s", c.pcr.Spec.PodUID, testPod.UID)
	}
}

// TestGone: a pending request deleted is made again at its delete event;
// one never seen is made again 10 minutes after its creation.
func TestGone(t *testing.T) {
	t.Run("deleted", func(t *testing.T) {
		h := newHarness(t)
		_, _ = h.credentials(testPod, 0, srcOf(KeyTypeECDSAP256))
		h.waitPending(1)
		if err := h.client.CertificatesV1().PodCertificateRequests("ns").Delete(h.ctx, "req-1", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if c := h.waitCreated(2); c.at != t0 {
			t.Errorf("made again at %v, want at once (%v)", c.at, t0)
		}
	})
	t.Run("never seen", func(t *testing.T) {
		h := newHarness(t)
		h.mu.Lock()
		h.hide = 1
		h.mu.Unlock()
		_, _ = h.credentials(testPod, 0, srcOf(KeyTypeECDSAP256))
		h.waitCreated(1)
		h.stepTo(t0.Add(abandonAfter))
		if c := h.waitCreated(2); c.at.Before(t0.Add(abandonAfter)) {
			t.Errorf("made again at %v, before %v", c.at, t0.Add(abandonAfter))
		}
	})
}

// TestRetry: a request that cannot be made (the service account missing)
// is not ready with the cause, and is tried again after a backoff.
func TestRetry(t *testing.T) {
	h := newHarness(t, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, UID: nodeUID}})
	_, _ = h.credentials(testPod, 0, srcOf(KeyTypeECDSAP256))
	var at time.Time
	h.waitFor("a retry timer", func() bool {
		if len(h.armedAt) == 0 {
			return false
		}
		at = h.armedAt[len(h.armedAt)-1]
		return at.After(t0)
	})
	_, err := h.credentials(testPod, 0, srcOf(KeyTypeECDSAP256))
	if !errors.Is(err, volume.ErrNotReady) || !strings.Contains(err.Error(), `reading service account ns/sa: serviceaccounts "sa" not found`) {
		t.Errorf("Credentials = %v, want not ready naming the missing service account", err)
	}
	sa := &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "sa", UID: saUID}}
	if _, err := h.client.CoreV1().ServiceAccounts("ns").Create(h.ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.clock.SetTime(at)
	if c := h.waitCreated(1); c.pcr.Spec.ServiceAccountUID != saUID {
		t.Errorf("service account UID %q, want %q", c.pcr.Spec.ServiceAccountUID, saUID)
	}
}

// TestBadRequest: a request that cannot be served is refused at once, not
// retried.
func TestBadRequest(t *testing.T) {
	h := newHarness(t)
	for _, tt := range []struct {
		name string
		pod  podvol.PodRef
		src  *v1.PodCertificateProjection
		want string
	}{
		{"no source", testPod, nil, "no source"},
		{"unknown key type", testPod, srcOf("RSA2048"), `unknown key type "RSA2048"`},
		{"no signer", testPod, &v1.PodCertificateProjection{KeyType: KeyTypeED25519}, "no signerName"},
		{"pod known by UID only", podvol.PodRef{UID: "x"}, srcOf(KeyTypeED25519), "namespace, name and UID are needed"},
		{"no service account", podvol.PodRef{UID: "x", Namespace: "ns", Name: "p"}, srcOf(KeyTypeED25519), "no service account"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := h.credentials(tt.pod, 0, tt.src)
			if err == nil || errors.Is(err, volume.ErrNotReady) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Credentials = %v, want a permanent error with %q", err, tt.want)
			}
		})
	}
	h.m.mu.Lock()
	defer h.m.mu.Unlock()
	if len(h.m.recs) != 0 {
		t.Errorf("%d sources kept, want none", len(h.m.recs))
	}
}

// TestNodeAuthorizer: everything the Manager asks of the API server is
// what the Node authorizer allows a node: GET of a ServiceAccount and of
// its own Node, create of PodCertificateRequests, list and watch of them
// only with the field selector spec.nodeName.
func TestNodeAuthorizer(t *testing.T) {
	h := newHarness(t)
	for i := range 2 {
		_, _ = h.credentials(testPod, i, srcOf(KeyTypeECDSAP256))
	}
	h.waitCreated(2)
	for _, a := range h.client.Actions() {
		res, verb := a.GetResource().Resource, a.GetVerb()
		switch {
		case res == "serviceaccounts" && verb == "get" && a.GetSubresource() == "":
		case res == "nodes" && verb == "get" && a.(k8stesting.GetAction).GetName() == nodeName:
		case res == "podcertificaterequests" && verb == "create" && a.GetSubresource() == "":
		case res == "podcertificaterequests" && verb == "list":
			if got := a.(k8stesting.ListAction).GetListRestrictions().Fields.String(); got != "spec.nodeName="+nodeName {
				t.Errorf("list with field selector %q", got)
			}
		case res == "podcertificaterequests" && verb == "watch":
			if got := a.(k8stesting.WatchAction).GetWatchRestrictions().Fields.String(); got != "spec.nodeName="+nodeName {
				t.Errorf("watch with field selector %q", got)
			}
		default:
			t.Errorf("%s %s/%s: not allowed to a node", verb, res, a.GetSubresource())
		}
	}
	if n := countActions(h, "get", "nodes"); n != 1 {
		t.Errorf("%d GETs of the Node, want 1 (its UID is kept)", n)
	}
}

func countActions(h *harness, verb, resource string) int {
	n := 0
	for _, a := range h.client.Actions() {
		if a.GetVerb() == verb && a.GetResource().Resource == resource {
			n++
		}
	}
	return n
}

// TestNothingAskedUntilNeeded: a running manager whose node has no
// podCertificate source asks the API server for nothing (an older server
// may not serve PodCertificateRequests, the node's rights may not cover
// them); the first Credentials call starts its watch.
func TestNothingAskedUntilNeeded(t *testing.T) {
	client := fake.NewClientset()
	m, err := New(Config{Client: client, NodeName: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); m.Run(ctx) }()
	defer func() { cancel(); <-done }()
	// A yield for Run to reach its wait (best effort: an eager watch shows
	// here most of the time; the list after Credentials below always does).
	runtime.Gosched()
	if n := len(client.Actions()); n != 0 {
		t.Fatalf("%d requests before any source, want none: %v", n, client.Actions())
	}
	_, _ = m.Credentials(ctx, Request{Pod: podvol.PodRef{UID: "u", Namespace: "ns", Name: "p", ServiceAccount: "sa"}, Volume: "v",
		Source: &v1.PodCertificateProjection{SignerName: "example.com/s", KeyType: KeyTypeECDSAP256}})
	if err := wait.PollUntilContextTimeout(ctx, time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		for _, a := range client.Actions() {
			if a.GetVerb() == "list" && a.GetResource().Resource == "podcertificaterequests" {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("no list of podcertificaterequests after the first Credentials call: %v", client.Actions())
	}
}
