package volumemanager

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"math/big"
	"path/filepath"
	"sync"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/volume/projected"
)

// podSigner is the signer name of the test's pod certificates.
const podSigner = "example.com/pods"

// testSigner plays a PodCertificateRequest signer with an admin client: it
// watches the requests for its signer and issues each new one a
// certificate for the request's public key, signed by its CA, setting the
// status as API validation wants an issued request (the Issued condition,
// the chain with the leaf first, notBefore and notAfter as in the leaf,
// beginRefreshAt between them).
type testSigner struct {
	ca *testCA

	mu     sync.Mutex
	issued []*certificatesv1.PodCertificateRequest // as the signer updated them
	errs   []error
}

// startTestSigner runs a signer for podSigner until the test ends.
func startTestSigner(t *testing.T, admin kubernetes.Interface, ca *testCA) *testSigner {
	t.Helper()
	s := &testSigner{ca: ca}
	ctx, cancel := context.WithCancel(t.Context())
	w, err := admin.CertificatesV1().PodCertificateRequests(metav1.NamespaceAll).Watch(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.signerName", podSigner).String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			pcr, ok := ev.Object.(*certificatesv1.PodCertificateRequest)
			if ev.Type != watch.Added || !ok {
				continue
			}
			issued, err := s.issue(ctx, admin, pcr)
			s.mu.Lock()
			if err != nil {
				s.errs = append(s.errs, fmt.Errorf("issuing %s/%s: %w", pcr.Namespace, pcr.Name, err))
			} else {
				s.issued = append(s.issued, issued)
			}
			s.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		w.Stop()
		<-done
		if err := errors.Join(s.errs...); err != nil {
			t.Errorf("the signer: %v", err)
		}
	})
	return s
}

// requests returns the requests the signer issued.
func (s *testSigner) requests() []*certificatesv1.PodCertificateRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*certificatesv1.PodCertificateRequest(nil), s.issued...)
}

// issue signs a certificate for pcr's public key, valid two hours (at most
// the request's maxExpirationSeconds), and sets pcr's status.
func (s *testSigner) issue(ctx context.Context, admin kubernetes.Interface, pcr *certificatesv1.PodCertificateRequest) (*certificatesv1.PodCertificateRequest, error) {
	csr, err := x509.ParseCertificateRequest(pcr.Spec.StubPKCS10Request)
	if err != nil {
		return nil, fmt.Errorf("the request's stubPKCS10Request: %w", err)
	}
	lifetime := 2 * time.Hour
	if m := pcr.Spec.MaxExpirationSeconds; m != nil && time.Duration(*m)*time.Second < lifetime {
		lifetime = time.Duration(*m) * time.Second
	}
	// Seconds: what a certificate and a metav1.Time hold alike.
	notBefore := time.Now().UTC().Truncate(time.Second)
	notAfter := notBefore.Add(lifetime)
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(notBefore.UnixNano()),
		NotBefore:    notBefore, NotAfter: notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, s.ca.cert, csr.PublicKey, s.ca.key)
	if err != nil {
		return nil, err
	}
	pcr = pcr.DeepCopy()
	pcr.Status = certificatesv1.PodCertificateRequestStatus{
		Conditions: []metav1.Condition{{
			Type: certificatesv1.PodCertificateRequestConditionTypeIssued, Status: metav1.ConditionTrue,
			Reason: "Signed", Message: "issued by the test signer", LastTransitionTime: metav1.Now(),
		}},
		CertificateChain: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})) + s.ca.pem(),
		NotBefore:        &metav1.Time{Time: notBefore},
		BeginRefreshAt:   &metav1.Time{Time: notBefore.Add(lifetime / 2)},
		NotAfter:         &metav1.Time{Time: notAfter},
	}
	return admin.CertificatesV1().PodCertificateRequests(pcr.Namespace).UpdateStatus(ctx, pcr, metav1.UpdateOptions{})
}

// TestIntegrationPodCertificate runs a pod with a projected podCertificate
// source under the node's own credentials (the Node authorizer,
// NodeRestriction; PodCertificateRequest is GA and on in 1.37), the test
// playing the signer: the node creates the PodCertificateRequest (the
// admission plugin checks its node, pod and service account against the
// API's), the signer issues it, and the pod's files hold the new key, the
// issued chain, and both in the credential bundle, on the volume's tmpfs.
// The node asks for nothing it may not: one create, a watch of the
// requests of its own node (spec.nodeName), a GET of the service account.
func TestIntegrationPodCertificate(t *testing.T) {
	e := startObjectsEnv(t)
	ctx := t.Context()
	ca := newTestCA(t, "pod-signer")
	signer := startTestSigner(t, e.admin, ca)
	sa, err := e.admin.CoreV1().ServiceAccounts(objectsNS).Create(ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "worker"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vol := v1.Volume{Name: "identity", VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{
		{PodCertificate: &v1.PodCertificateProjection{SignerName: podSigner, KeyType: "ECDSAP256",
			CredentialBundlePath: "credentials.pem", KeyPath: "tls.key", CertificateChainPath: "tls.crt"}},
	}}}}
	pod := e.createPod(t, csitest.Pod(objectsNS, "web", csitest.PodSpec{Node: node, ServiceAccount: "worker", Volumes: []csitest.PodVolume{
		{Name: vol.Name, Source: vol.VolumeSource, ReadOnly: true},
	}}))
	e.waitNodeMayGet(t, "serviceaccounts", "worker")
	e.mountPod(t, pod)

	// The node may see the issued status before the signer's update
	// returns to it.
	var issued []*certificatesv1.PodCertificateRequest
	eventually(t, "the signer's update to return", func() bool { issued = signer.requests(); return len(issued) > 0 })
	if len(issued) != 1 {
		t.Fatalf("the signer issued %d requests, want 1", len(issued))
	}
	checkPodCertificateRequest(t, e, issued[0], pod, sa)
	dir := e.volumeDir(pod, pluginDir(projected.PluginName), "identity")
	key, chain := readFile(filepath.Join(dir, "tls.key")), readFile(filepath.Join(dir, "tls.crt"))
	if chain != issued[0].Status.CertificateChain {
		t.Errorf("tls.crt:\n%s\nwant the issued chain:\n%s", chain, issued[0].Status.CertificateChain)
	}
	if got := readFile(filepath.Join(dir, "credentials.pem")); got != key+chain {
		t.Errorf("credentials.pem:\n%s\nwant the key, then the chain", got)
	}
	checkKeyMatchesChain(t, key, chain, ca)
	e.checkMounts(t, dir)

	// The requests' informer lists as a watch stream (client-go's
	// WatchListClient, on by default since 1.35): one WATCH, no LIST.
	got := map[string]int{}
	for _, r := range e.log.requests("podcertificaterequests", "serviceaccounts") {
		got[fmt.Sprintf("%s %s %s/%s: %d", r.verb, r.resource, r.namespace, r.name, r.status)]++
	}
	want := map[string]int{
		"POST podcertificaterequests " + objectsNS + "/: 201": 1,
		"WATCH podcertificaterequests /: 200":                 1,
		"GET serviceaccounts " + objectsNS + "/worker: 200":   1,
	}
	if !maps.Equal(got, want) {
		t.Errorf("the node's requests: %v, want %v", got, want)
	}
	e.checkNoRefusals(t)
	e.deletePod(t, pod)
	e.checkMounts(t)
}

// waitNodeMayGet waits until the Node authorizer lets this node get the
// object (a new pod's references reach its graph a moment after the
// create).
func (e *objectsEnv) waitNodeMayGet(t *testing.T, resource, name string) {
	t.Helper()
	eventually(t, "the Node authorizer to allow "+resource+" "+name, func() bool {
		review, err := e.admin.AuthorizationV1().SubjectAccessReviews().Create(t.Context(), groupAccessReview("", resource, objectsNS, name), metav1.CreateOptions{})
		return err == nil && review.Status.Allowed
	})
}

// checkPodCertificateRequest checks what the node asked for: its node,
// the pod and its service account, with their UIDs; the pod as owner; the
// API server's default maxExpirationSeconds (24 h) where the source sets
// none.
func checkPodCertificateRequest(t *testing.T, e *objectsEnv, pcr *certificatesv1.PodCertificateRequest, pod *v1.Pod, sa *v1.ServiceAccount) {
	t.Helper()
	n, err := e.admin.CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	type request struct {
		Signer, NodeName, NodeUID, PodName, PodUID, SAName, SAUID string
		MaxExpirationSeconds                                      int32
		Owners                                                    string
	}
	s := pcr.Spec
	got := request{s.SignerName, string(s.NodeName), string(s.NodeUID), s.PodName, string(s.PodUID), s.ServiceAccountName,
		string(s.ServiceAccountUID), 0, fmt.Sprint(ownerUIDs(pcr))}
	if s.MaxExpirationSeconds != nil {
		got.MaxExpirationSeconds = *s.MaxExpirationSeconds
	}
	want := request{podSigner, node, string(n.UID), pod.Name, string(pod.UID), sa.Name, string(sa.UID), 86400,
		fmt.Sprint([]string{"Pod/" + string(pod.UID)})}
	if got != want {
		t.Errorf("the PodCertificateRequest:\n%+v\nwant\n%+v", got, want)
	}
}

func ownerUIDs(o metav1.Object) []string {
	var out []string
	for _, r := range o.GetOwnerReferences() {
		out = append(out, r.Kind+"/"+string(r.UID))
	}
	return out
}

// checkKeyMatchesChain checks that the key file is one PKCS#8 private key
// whose public key is the chain's leaf's, and that the leaf verifies
// against ca.
func checkKeyMatchesChain(t *testing.T, keyPEM, chainPEM string, ca *testCA) {
	t.Helper()
	kb, rest := pem.Decode([]byte(keyPEM))
	if kb == nil || kb.Type != "PRIVATE KEY" || len(rest) != 0 {
		t.Fatalf("tls.key is not one PRIVATE KEY block: %q", keyPEM)
	}
	key, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	cb, _ := pem.Decode([]byte(chainPEM))
	if cb == nil {
		t.Fatalf("tls.crt holds no PEM block")
	}
	leaf, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	pub, ok := key.(crypto.Signer)
	if !ok || !leaf.PublicKey.(interface{ Equal(crypto.PublicKey) bool }).Equal(pub.Public()) {
		t.Errorf("the leaf certificate was not issued for the key in tls.key")
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("the leaf does not verify against the signer's CA: %v", err)
	}
}
