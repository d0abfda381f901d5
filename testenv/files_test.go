package testenv

import (
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TestCredentialFiles checks the files a controller manager is given: the
// apiserver's serving certificate verifies against CAFile on Port, and a
// service account token the apiserver issues is signed by the key in
// ServiceAccountKeyFile.
func TestCredentialFiles(t *testing.T) {
	env := StartT(t, Options{})
	ctx := t.Context()
	if want := fmt.Sprintf("https://127.0.0.1:%d", env.Port()); env.host() != want {
		t.Errorf("Host %s, want %s (Port %d)", env.host(), want, env.Port())
	}

	caPEM, err := os.ReadFile(env.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		t.Fatalf("CAFile %s holds no certificate", env.CAFile())
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	resp, err := hc.Get(env.host() + "/readyz")
	if err != nil {
		t.Fatalf("the serving certificate against CAFile: %v", err)
	}
	resp.Body.Close()

	keyPEM, err := os.ReadFile(env.ServiceAccountKeyFile())
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(keyPEM)
	if block == nil {
		t.Fatalf("ServiceAccountKeyFile %s holds no PEM block", env.ServiceAccountKeyFile())
	}
	parsed, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	key, ok := parsed.(*ecdsa.PrivateKey)
	if !ok {
		t.Fatalf("ServiceAccountKeyFile holds a %T, want an ECDSA key", parsed)
	}
	client := kubernetes.NewForConfigOrDie(env.Config())
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "probe"}}
	if _, err := client.CoreV1().ServiceAccounts("default").Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := client.CoreV1().ServiceAccounts("default").CreateToken(ctx, "probe", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// An ES256 JWT: the signature is r||s over "header.payload".
	parts := strings.Split(tr.Status.Token, ".")
	if len(parts) != 3 {
		t.Fatalf("token has %d parts, want 3", len(parts))
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || len(sig) != 64 {
		t.Fatalf("token signature: %d bytes (%v), want 64", len(sig), err)
	}
	digest := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	r, s := new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:])
	if !ecdsa.Verify(&key.PublicKey, digest[:], r, s) {
		t.Error("the apiserver's service account token does not verify with ServiceAccountKeyFile's key")
	}
}
