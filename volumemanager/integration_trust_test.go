package volumemanager

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"maps"
	"math/big"
	"net/http"
	"path/filepath"
	"slices"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/volume/projected"
)

// testCA is a certificate authority a test makes: the roots of its trust
// bundles, and the signer of its pod certificates.
type testCA struct {
	cert *x509.Certificate
	key  crypto.Signer
	der  []byte
}

// newTestCA makes a self-signed P-256 CA named cn.
func newTestCA(t *testing.T, cn string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, der: der}
}

// pem is the CA's certificate as one PEM block.
func (ca *testCA) pem() string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.der}))
}

// anchors is the file a clusterTrustBundle source projects for the CAs:
// each certificate once, as a CERTIFICATE block, sorted by content (how
// nodevol orders the kubelet's shuffled bundle).
func anchors(cas ...*testCA) string {
	ders := make([][]byte, 0, len(cas))
	for _, ca := range cas {
		ders = append(ders, ca.der)
	}
	slices.SortFunc(ders, bytes.Compare)
	var out []byte
	for _, der := range ders {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	return string(out)
}

// trustSigner is the signer whose ClusterTrustBundles the test selects;
// its bundles' names start with it, "/" written ":" (API validation).
const trustSigner = "example.com/roots"

// TestIntegrationClusterTrustBundle runs a pod with a projected volume of
// two clusterTrustBundle sources, one naming a bundle and one selecting a
// signer's bundles by label, under the node's own credentials (the Node
// authorizer, NodeRestriction; the API server serves
// certificates.k8s.io/v1 ClusterTrustBundles by default since 1.37): the
// files hold the bundles' certificates, on the volume's tmpfs; an update
// of the named bundle and a new bundle the selector matches reach the
// files; the node reads each source with one list and one watch (the
// name's field selector, or the signer's field selector and the label
// selector), none refused.
func TestIntegrationClusterTrustBundle(t *testing.T) {
	e := startObjectsEnv(t)
	ctx := t.Context()
	site, app, other, siteNext, appNext := newTestCA(t, "site"), newTestCA(t, "app"), newTestCA(t, "other"), newTestCA(t, "site-next"), newTestCA(t, "app-next")
	bundles := e.admin.CertificatesV1().ClusterTrustBundles()
	for _, b := range []*certificatesv1.ClusterTrustBundle{
		{ObjectMeta: metav1.ObjectMeta{Name: "site-roots"}, Spec: certificatesv1.ClusterTrustBundleSpec{TrustBundle: site.pem()}},
		trustBundle("one", "app", app),
		trustBundle("other", "other", other),
	} {
		if _, err := bundles.Create(ctx, b, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating ClusterTrustBundle %s: %v", b.Name, err)
		}
	}
	vol := v1.Volume{Name: "trust", VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{
		{ClusterTrustBundle: &v1.ClusterTrustBundleProjection{Name: new("site-roots"), Path: "named.pem"}},
		{ClusterTrustBundle: &v1.ClusterTrustBundleProjection{SignerName: new(trustSigner),
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"trust": "app"}}, Path: "signer.pem"}},
	}}}}
	pod := e.createPod(t, csitest.Pod(objectsNS, "web", csitest.PodSpec{Node: node, Volumes: []csitest.PodVolume{
		{Name: vol.Name, Source: vol.VolumeSource, ReadOnly: true},
	}}))
	e.mountPod(t, pod)

	dir := e.volumeDir(pod, pluginDir(projected.PluginName), "trust")
	named, signer := filepath.Join(dir, "named.pem"), filepath.Join(dir, "signer.pem")
	if got, want := readFile(named), anchors(site); got != want {
		t.Errorf("named.pem:\n%s\nwant the site CA:\n%s", got, want)
	}
	if got, want := readFile(signer), anchors(app); got != want {
		t.Errorf("signer.pem:\n%s\nwant the app CA alone (not the bundle labelled other):\n%s", got, want)
	}
	e.checkMounts(t, dir)

	// The named bundle updated, a new bundle of the signer selected.
	b, err := bundles.Get(ctx, "site-roots", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b.Spec.TrustBundle = site.pem() + siteNext.pem()
	if _, err := bundles.Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := bundles.Create(ctx, trustBundle("two", "app", appNext), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the updated bundle in named.pem and the new bundle in signer.pem", func() bool {
		return readFile(named) == anchors(site, siteNext) && readFile(signer) == anchors(app, appNext)
	})

	got := map[string]int{}
	for _, r := range e.log.requests("clustertrustbundles") {
		got[fmt.Sprintf("%s %s initial=%t", r.verb, r.name, r.initial)]++
	}
	if want := map[string]int{"WATCH site-roots initial=true": 1, "WATCH  initial=true": 1}; !maps.Equal(got, want) {
		t.Errorf("the node's requests of ClusterTrustBundles: %v, want %v (one watch-list request by name, one by the signer's selectors)", got, want)
	}
	e.checkNoRefusals(t)
	e.deletePod(t, pod)
	e.checkMounts(t)
}

// trustBundle is a ClusterTrustBundle of trustSigner named suffix,
// labelled trust=label, holding ca.
func trustBundle(suffix, label string, ca *testCA) *certificatesv1.ClusterTrustBundle {
	return &certificatesv1.ClusterTrustBundle{
		ObjectMeta: metav1.ObjectMeta{Name: "example.com:roots:" + suffix, Labels: map[string]string{"trust": label}},
		Spec:       certificatesv1.ClusterTrustBundleSpec{SignerName: trustSigner, TrustBundle: ca.pem()},
	}
}

// checkNoRefusals checks that the API server refused none of the volume
// manager's requests.
func (e *objectsEnv) checkNoRefusals(t *testing.T) {
	t.Helper()
	for _, r := range e.log.requests() {
		if r.status == http.StatusForbidden {
			t.Errorf("refused: %v", r)
		}
	}
}
