package podcert

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"
)

// TestKeyAndProof: for each key type the API allows, the key is one
// PKCS#8 PRIVATE KEY block of that type, and the PKCS#10 request is empty,
// carries the key's public key and is signed by it (what the API server
// checks as the proof of possession).
func TestKeyAndProof(t *testing.T) {
	for _, tt := range []struct {
		keyType string
		check   func(crypto.PublicKey) bool
	}{
		{KeyTypeRSA3072, func(p crypto.PublicKey) bool { k, ok := p.(*rsa.PublicKey); return ok && k.N.BitLen() == 3072 }},
		{KeyTypeRSA4096, func(p crypto.PublicKey) bool { k, ok := p.(*rsa.PublicKey); return ok && k.N.BitLen() == 4096 }},
		{KeyTypeECDSAP256, func(p crypto.PublicKey) bool { k, ok := p.(*ecdsa.PublicKey); return ok && k.Curve == elliptic.P256() }},
		{KeyTypeECDSAP384, func(p crypto.PublicKey) bool { k, ok := p.(*ecdsa.PublicKey); return ok && k.Curve == elliptic.P384() }},
		{KeyTypeECDSAP521, func(p crypto.PublicKey) bool { k, ok := p.(*ecdsa.PublicKey); return ok && k.Curve == elliptic.P521() }},
		{KeyTypeED25519, func(p crypto.PublicKey) bool { _, ok := p.(ed25519.PublicKey); return ok }},
	} {
		t.Run(tt.keyType, func(t *testing.T) {
			t.Parallel()
			keyPEM, csrDER, err := keyAndProof(tt.keyType)
			if err != nil {
				t.Fatalf("keyAndProof: %v", err)
			}
			if !knownKeyType(tt.keyType) {
				t.Errorf("knownKeyType(%q) = false", tt.keyType)
			}
			key := parseKey(t, keyPEM)
			csr, err := x509.ParseCertificateRequest(csrDER)
			if err != nil {
				t.Fatalf("parsing the PKCS#10 request: %v", err)
			}
			if err := csr.CheckSignature(); err != nil {
				t.Errorf("the request's signature does not check: %v", err)
			}
			if !tt.check(csr.PublicKey) {
				t.Errorf("the request's public key is a %T, not a %s key", csr.PublicKey, tt.keyType)
			}
			if !key.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(csr.PublicKey) {
				t.Error("the request's public key is not the key's")
			}
			if len(csr.Subject.Names) != 0 || len(csr.DNSNames) != 0 || len(csr.Extensions) != 0 {
				t.Errorf("the request is not empty: %+v", csr)
			}
		})
	}
}

// parseKey decodes what keyAndProof returned as the key: exactly one
// PKCS#8 PRIVATE KEY block.
func parseKey(t *testing.T, keyPEM []byte) crypto.Signer {
	t.Helper()
	b, rest := pem.Decode(keyPEM)
	if b == nil || b.Type != "PRIVATE KEY" || len(rest) != 0 {
		t.Fatalf("the key is not one PRIVATE KEY PEM block: %q", keyPEM)
	}
	k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		t.Fatalf("parsing the PKCS#8 key: %v", err)
	}
	return k.(crypto.Signer)
}

// TestUnknownKeyType: a key type the API does not allow is refused.
func TestUnknownKeyType(t *testing.T) {
	for _, kt := range []string{"", "RSA2048", "ecdsap256", "ECDSAP224"} {
		if knownKeyType(kt) {
			t.Errorf("knownKeyType(%q) = true", kt)
		}
		if _, _, err := keyAndProof(kt); err == nil || !strings.Contains(err.Error(), "unknown key type") {
			t.Errorf("keyAndProof(%q) = %v, want an unknown key type error", kt, err)
		}
	}
}

// TestCleanChain: headers and text between blocks are dropped, and each
// block comes out as a bare CERTIFICATE block.
func TestCleanChain(t *testing.T) {
	block := func(typ string, headers map[string]string, b string) string {
		return string(pem.EncodeToMemory(&pem.Block{Type: typ, Headers: headers, Bytes: []byte(b)}))
	}
	for _, tt := range []struct {
		name, in, want string
	}{
		{"empty", "", ""},
		{"no block", "not pem at all\n", ""},
		{"one", block("CERTIFICATE", nil, "leaf"), block("CERTIFICATE", nil, "leaf")},
		{"text around and between", "leading\n" + block("CERTIFICATE", nil, "leaf") + "between\n" + block("CERTIFICATE", nil, "ca") + "trailing",
			block("CERTIFICATE", nil, "leaf") + block("CERTIFICATE", nil, "ca")},
		{"headers dropped", block("CERTIFICATE", map[string]string{"Comment": "x"}, "leaf"), block("CERTIFICATE", nil, "leaf")},
		{"type made CERTIFICATE", block("TRUSTED CERTIFICATE", nil, "leaf"), block("CERTIFICATE", nil, "leaf")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(cleanChain(tt.in)); got != tt.want {
				t.Errorf("cleanChain = %q, want %q", got, tt.want)
			}
		})
	}
}
