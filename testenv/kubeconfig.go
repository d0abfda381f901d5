package testenv

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// kubeconfigCluster is the name of the environment's cluster and context in
// the kubeconfig files that WriteKubeconfig writes.
const kubeconfigCluster = "testenv"

// WriteKubeconfig writes cfg, a client config of this environment (from
// Config, TokenConfig or CertConfig), as a kubeconfig file at path (mode
// 0600), for a client that takes --kubeconfig: a node agent or a kubelet
// run as a process. The file holds one cluster and one context named
// "testenv", the current one, and one user named after the identity (the
// token's user, or the client certificate's common name); the CA, the
// token, the certificate and its key are written into it, so it needs no
// other file. A client loads it with clientcmd.BuildConfigFromFlags("",
// path).
//
// It fails when cfg is not for this environment's apiserver, or carries
// neither a bearer token nor a client certificate and key.
func (e *Env) WriteKubeconfig(path string, cfg *rest.Config) error {
	kc, err := e.kubeconfig(cfg)
	if err != nil {
		return err
	}
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("testenv: write kubeconfig %s: %w", path, err)
	}
	return nil
}

// kubeconfig is cfg as a kubeconfig.
func (e *Env) kubeconfig(cfg *rest.Config) (*clientcmdapi.Config, error) {
	if cfg == nil {
		return nil, errors.New("testenv: kubeconfig: no client config")
	}
	if cfg.Host != e.host() {
		return nil, fmt.Errorf("testenv: kubeconfig: client config for %q, not this environment's apiserver %s", cfg.Host, e.host())
	}
	user := &clientcmdapi.AuthInfo{}
	var name string
	switch {
	case cfg.BearerToken != "":
		user.Token = cfg.BearerToken
		name = e.tokenUser(cfg.BearerToken)
	case len(cfg.CertData) > 0 && len(cfg.KeyData) > 0:
		user.ClientCertificateData, user.ClientKeyData = cfg.CertData, cfg.KeyData
		var err error
		if name, err = commonName(cfg.CertData); err != nil {
			return nil, err
		}
	default:
		return nil, errors.New("testenv: kubeconfig: the client config has neither a bearer token nor a client certificate and key")
	}
	ca := cfg.CAData
	if len(ca) == 0 {
		ca = e.ca.certPEM
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters[kubeconfigCluster] = &clientcmdapi.Cluster{Server: e.host(), CertificateAuthorityData: ca}
	kc.AuthInfos[name] = user
	kc.Contexts[kubeconfigCluster] = &clientcmdapi.Context{Cluster: kubeconfigCluster, AuthInfo: name}
	kc.CurrentContext = kubeconfigCluster
	return kc, nil
}

// tokenUser is the name of the user whose token tok is, or "user" for a
// token the environment did not issue.
func (e *Env) tokenUser(tok string) string {
	for name, t := range e.tokens {
		if t == tok {
			return name
		}
	}
	return "user"
}

// commonName is the subject's common name of the first certificate in
// certPEM.
func commonName(certPEM []byte) (string, error) {
	block, _ := pem.Decode(certPEM)
	if block == nil {
		return "", errors.New("testenv: kubeconfig: the client certificate is not PEM")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return "", fmt.Errorf("testenv: kubeconfig: parse the client certificate: %w", err)
	}
	if cert.Subject.CommonName == "" {
		return "", errors.New("testenv: kubeconfig: the client certificate has no common name")
	}
	return cert.Subject.CommonName, nil
}
