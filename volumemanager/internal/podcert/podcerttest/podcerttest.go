// Package podcerttest plays a signer of PodCertificateRequests in tests:
// it issues, with a test CA, a certificate for a request's public key and
// gives the status a signer sets (the Issued condition, the chain, the
// validity and refresh times), or a status with one condition (Denied,
// Failed). Imported by tests only.
package podcerttest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// Condition is a status with one condition of type typ, true since at.
func Condition(typ, reason, message string, at time.Time) certificatesv1.PodCertificateRequestStatus {
	return certificatesv1.PodCertificateRequestStatus{Conditions: []metav1.Condition{{
		Type: typ, Status: metav1.ConditionTrue, Reason: reason, Message: message, LastTransitionTime: metav1.NewTime(at),
	}}}
}

// Issue returns the status of pcr issued by a new test CA, valid from
// notBefore to notAfter, to be refreshed from beginRefreshAt: its chain
// is the leaf (for the public key of the request's PKCS#10 request, named
// after the pod), then the CA as an intermediate written with a PEM
// header and text between the blocks, as a signer may write it. It also
// returns the chain a node must project: the same blocks with neither.
func Issue(pcr *certificatesv1.PodCertificateRequest, notBefore, beginRefreshAt, notAfter time.Time) (certificatesv1.PodCertificateRequestStatus, []byte, error) {
	csr, err := x509.ParseCertificateRequest(pcr.Spec.StubPKCS10Request)
	if err != nil {
		return certificatesv1.PodCertificateRequestStatus{}, nil, fmt.Errorf("parsing the PKCS#10 request of request %s: %w", pcr.Name, err)
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return certificatesv1.PodCertificateRequestStatus{}, nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"}, IsCA: true, BasicConstraintsValid: true,
		NotBefore: notBefore, NotAfter: notAfter.Add(time.Hour), KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := sign(caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		return certificatesv1.PodCertificateRequestStatus{}, nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return certificatesv1.PodCertificateRequestStatus{}, nil, err
	}
	leafTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: pcr.Spec.PodName}, NotBefore: notBefore, NotAfter: notAfter,
	}
	leafDER, err := sign(leafTmpl, ca, csr.PublicKey, caKey)
	if err != nil {
		return certificatesv1.PodCertificateRequestStatus{}, nil, err
	}
	leaf := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER})
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	withHeader := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Headers: map[string]string{"Comment": "intermediate"}, Bytes: caDER})
	st := Condition(certificatesv1.PodCertificateRequestConditionTypeIssued, "Issued", "", notBefore)
	st.CertificateChain = string(leaf) + "the intermediate:\n" + string(withHeader)
	st.NotBefore = ptr.To(metav1.NewTime(notBefore))
	st.BeginRefreshAt = ptr.To(metav1.NewTime(beginRefreshAt))
	st.NotAfter = ptr.To(metav1.NewTime(notAfter))
	return st, append(leaf, caPEM...), nil
}

func sign(tmpl, parent *x509.Certificate, pub crypto.PublicKey, key crypto.Signer) ([]byte, error) {
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, key)
	if err != nil {
		return nil, fmt.Errorf("signing a test certificate: %w", err)
	}
	return der, nil
}
