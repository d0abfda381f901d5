package podcert

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
)

// The key types a podCertificate source may ask for, as the API validates
// them (core/v1 PodCertificateProjection.keyType).
const (
	KeyTypeRSA3072   = "RSA3072"
	KeyTypeRSA4096   = "RSA4096"
	KeyTypeECDSAP256 = "ECDSAP256"
	KeyTypeECDSAP384 = "ECDSAP384"
	KeyTypeECDSAP521 = "ECDSAP521"
	KeyTypeED25519   = "ED25519"
)

// newKey generates a private key of keyType.
func newKey(keyType string) (crypto.Signer, error) {
	switch keyType {
	case KeyTypeRSA3072:
		return rsa.GenerateKey(rand.Reader, 3072)
	case KeyTypeRSA4096:
		return rsa.GenerateKey(rand.Reader, 4096)
	case KeyTypeECDSAP256:
		return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case KeyTypeECDSAP384:
		return ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	case KeyTypeECDSAP521:
		return ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	case KeyTypeED25519:
		_, k, err := ed25519.GenerateKey(rand.Reader)
		return k, err
	}
	return nil, fmt.Errorf("unknown key type %q", keyType)
}

// knownKeyType reports whether newKey can make keys of keyType.
func knownKeyType(keyType string) bool {
	switch keyType {
	case KeyTypeRSA3072, KeyTypeRSA4096, KeyTypeECDSAP256, KeyTypeECDSAP384, KeyTypeECDSAP521, KeyTypeED25519:
		return true
	}
	return false
}

// keyAndProof generates a key of keyType and returns it PEM-encoded (one
// PKCS#8 "PRIVATE KEY" block, what the pod gets) with an empty PKCS#10
// request signed by it (DER): the request's signature is the proof that
// the node holds the key of the public key it asks a certificate for, and
// the API server checks it when the PodCertificateRequest is created.
func keyAndProof(keyType string) (keyPEM, csrDER []byte, err error) {
	key, err := newKey(keyType)
	if err != nil {
		return nil, nil, fmt.Errorf("generating a %s key: %w", keyType, err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("encoding the %s key as PKCS#8: %w", keyType, err)
	}
	csrDER, err = x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		return nil, nil, fmt.Errorf("signing the PKCS#10 request with the %s key: %w", keyType, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), csrDER, nil
}

// cleanChain re-encodes each PEM block of an issued chain as a bare
// CERTIFICATE block: text between the blocks and block headers are
// dropped, as the API documents for what the kubelet projects.
func cleanChain(chain string) []byte {
	var out bytes.Buffer
	rest := []byte(chain)
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return out.Bytes()
		}
		out.Write(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: b.Bytes}))
	}
}
