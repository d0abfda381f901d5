package testenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/csv"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"k8s.io/client-go/rest"
)

// advertiseAddress is the apiserver's --advertise-address: the IP the
// kubernetes Service's endpoints name, from TEST-NET-1 (RFC 5737), which is
// never routed. No client connects to it.
const advertiseAddress = "192.0.2.1"

// startAttempts is how often Start tries fresh ports when one it picked was
// taken by another process before the binary could bind it.
const startAttempts = 3

// Env is a running etcd and kube-apiserver. Its methods are safe for
// concurrent use.
type Env struct {
	opts    Options
	dir     string // temporary root: certificates, tokens, logs, etcd's data
	ca      *authority
	tokens  map[string]string // user name -> bearer token, the admin's included
	etcdURL string
	apiPort int
	apiArgs []string

	mu        sync.Mutex
	etcd      *process
	apiserver *process // nil while stopped
	stopped   bool
	stopErr   error
}

// Start starts etcd and then kube-apiserver, each on free 127.0.0.1 ports
// with its files under one new temporary directory, and returns once the
// apiserver's /readyz answers ok (bounded by ctx and Options.StartTimeout).
// The caller must call Stop. On error nothing is left running or on disk;
// the error names what failed: a binary missing (wrapping
// ErrBinaryMissing, with how to build it), a process that exited early or
// never became ready (with the tail of its log).
func Start(ctx context.Context, opts Options) (*Env, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "nodevol-testenv-")
	if err != nil {
		return nil, fmt.Errorf("testenv: create temporary directory: %w", err)
	}
	e := &Env{opts: opts, dir: dir, tokens: map[string]string{}}
	if err := e.start(ctx); err != nil {
		if serr := e.Stop(); serr != nil {
			err = errors.Join(err, serr)
		}
		return nil, err
	}
	return e, nil
}

// start writes the certificates, keys and token file, then starts etcd and
// the apiserver.
func (e *Env) start(ctx context.Context) error {
	if err := e.writeCredentials(); err != nil {
		return err
	}
	if err := e.startEtcd(ctx); err != nil {
		return err
	}
	for attempt := 1; ; attempt++ {
		ports, err := freePorts(1)
		if err != nil {
			return err
		}
		e.apiPort = ports[0]
		e.apiArgs = e.apiserverArgs()
		err = e.StartAPIServer(ctx)
		if err == nil || attempt == startAttempts || !addrInUse(e.apiserver) {
			return err
		}
	}
}

// writeCredentials generates the CA, the serving certificate, the service
// account key and the tokens, and writes them under e.dir.
func (e *Env) writeCredentials() error {
	ca, err := newAuthority()
	if err != nil {
		return err
	}
	e.ca = ca
	serveCert, serveKey, err := ca.issue(pkix.Name{CommonName: "kube-apiserver"}, true,
		[]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, net.IPv4(10, 0, 0, 1)},
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"})
	if err != nil {
		return err
	}
	saKey, saPub, err := serviceAccountKey()
	if err != nil {
		return err
	}
	users := append([]User{{Name: adminName, Groups: []string{"system:masters"}}}, e.opts.Users...)
	var tokens bytes.Buffer
	w := csv.NewWriter(&tokens)
	for _, u := range users {
		tok, err := randomToken()
		if err != nil {
			return err
		}
		e.tokens[u.Name] = tok
		// token,user,uid,"group1,group2"
		if err := w.Write([]string{tok, u.Name, u.Name, strings.Join(u.Groups, ",")}); err != nil {
			return fmt.Errorf("testenv: write token file: %w", err)
		}
	}
	w.Flush()
	files := map[string][]byte{
		"ca.crt": ca.certPEM, "apiserver.crt": serveCert, "apiserver.key": serveKey,
		"sa.key": saKey, "sa.pub": saPub, "tokens.csv": tokens.Bytes(),
	}
	for name, data := range files {
		if err := os.WriteFile(e.path(name), data, 0o600); err != nil {
			return fmt.Errorf("testenv: write %s: %w", name, err)
		}
	}
	return nil
}

// startEtcd starts etcd on fresh ports (again, up to startAttempts, when a
// port was taken) and waits until it reports healthy.
func (e *Env) startEtcd(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		ports, err := freePorts(2)
		if err != nil {
			return err
		}
		client, peer := "http://"+hostPort(ports[0]), "http://"+hostPort(ports[1])
		args := []string{
			"--name=testenv",
			"--data-dir=" + e.path("etcd"),
			"--listen-client-urls=" + client,
			"--advertise-client-urls=" + client,
			"--listen-peer-urls=" + peer,
			"--initial-advertise-peer-urls=" + peer,
			"--initial-cluster=testenv=" + peer,
			"--unsafe-no-fsync", // a test's data need not survive a power cut
		}
		args = append(args, e.opts.EtcdArgs...)
		p, err := startProcess("etcd", e.opts.EtcdPath, args, e.path("etcd.log"))
		if err != nil {
			return err
		}
		e.mu.Lock()
		e.etcd, e.etcdURL = p, client
		e.mu.Unlock()
		probe := httpProbe(http.DefaultClient, client+"/health", nil)
		err = p.waitReady(ctx, e.opts.StartTimeout, probe)
		if err == nil || attempt == startAttempts || !addrInUse(p) {
			return err
		}
		_ = os.RemoveAll(e.path("etcd"))
	}
}

// apiserverArgs is kube-apiserver's command line.
func (e *Env) apiserverArgs() []string {
	args := []string{
		"--etcd-servers=" + e.etcdURL,
		"--bind-address=127.0.0.1",
		// Not 127.0.0.1: the kubernetes Service's endpoint reconciler
		// refuses a loopback address (at start since 1.37, with an error
		// every 10 s before), and turned off (none) it logs a "stale
		// endpoints" error at every start.
		"--advertise-address=" + advertiseAddress,
		fmt.Sprintf("--secure-port=%d", e.apiPort),
		"--tls-cert-file=" + e.path("apiserver.crt"),
		"--tls-private-key-file=" + e.path("apiserver.key"),
		"--client-ca-file=" + e.path("ca.crt"),
		"--token-auth-file=" + e.path("tokens.csv"),
		"--authorization-mode=" + strings.Join(e.opts.AuthorizationModes, ","),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + e.path("sa.pub"),
		"--service-account-signing-key-file=" + e.path("sa.key"),
		"--service-cluster-ip-range=10.0.0.0/24",
		"--allow-privileged=true",
	}
	if len(e.opts.EnableAdmissionPlugins) > 0 {
		args = append(args, "--enable-admission-plugins="+strings.Join(e.opts.EnableAdmissionPlugins, ","))
	}
	if len(e.opts.DisableAdmissionPlugins) > 0 {
		args = append(args, "--disable-admission-plugins="+strings.Join(e.opts.DisableAdmissionPlugins, ","))
	}
	return append(args, e.opts.APIServerArgs...)
}

// StartAPIServer starts kube-apiserver again after StopAPIServer, on the
// same address and with the same flags and credentials (clients and their
// configs keep working), and waits for /readyz. It does nothing when the
// apiserver is running. It fails after Stop.
func (e *Env) StartAPIServer(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped {
		return errStopped
	}
	if e.apiserver != nil && !e.apiserver.exited() {
		return nil
	}
	p, err := startProcess("kube-apiserver", e.opts.APIServerPath, e.apiArgs, e.path("kube-apiserver.log"))
	if err != nil {
		return err
	}
	e.apiserver = p
	client := e.httpClient()
	header := http.Header{"Authorization": {"Bearer " + e.tokens[adminName]}}
	return p.waitReady(ctx, e.opts.StartTimeout, httpProbe(client, e.host()+"/readyz", header))
}

// StopAPIServer stops kube-apiserver (SIGTERM, then SIGKILL after
// Options.StopTimeout) and waits for it to exit; etcd and its data stay.
// It does nothing when the apiserver is not running.
func (e *Env) StopAPIServer() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.apiserver != nil {
		e.apiserver.stop(e.opts.StopTimeout)
	}
}

// restartAPIServer stops kube-apiserver and starts it again on the same
// address (StopAPIServer, then StartAPIServer).
func (e *Env) restartAPIServer(ctx context.Context) error {
	e.StopAPIServer()
	return e.StartAPIServer(ctx)
}

// Stop stops kube-apiserver and etcd, waits until both have exited and
// removes the temporary directory with their data, logs and credentials.
// It is safe to call more than once, and concurrently: every call returns
// the first call's result, an error only when the directory could not be
// removed.
func (e *Env) Stop() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped {
		return e.stopErr
	}
	e.stopped = true
	if e.apiserver != nil {
		e.apiserver.stop(e.opts.StopTimeout)
	}
	if e.etcd != nil {
		e.etcd.stop(e.opts.StopTimeout)
	}
	if err := os.RemoveAll(e.dir); err != nil {
		e.stopErr = fmt.Errorf("testenv: remove %s: %w", e.dir, err)
	}
	return e.stopErr
}

// Config returns a new client config for the admin (AdminName, in
// system:masters), with client-go's default rate limits.
func (e *Env) Config() *rest.Config {
	return e.tokenConfig(e.tokens[adminName])
}

// TokenConfig returns a new client config with the bearer token of user
// name, one of Options.Users, or an error when there is no such user.
func (e *Env) TokenConfig(name string) (*rest.Config, error) {
	tok, ok := e.tokens[name]
	if !ok || name == adminName {
		return nil, fmt.Errorf("testenv: no token for user %q: list it in Options.Users", name)
	}
	return e.tokenConfig(tok), nil
}

// CertConfig returns a new client config that authenticates as u with a
// client certificate the environment's CA issues now (no restart needed):
// common name u.Name, organizations u.Groups. A node's identity is
// User{Name: "system:node:NAME", Groups: []string{"system:nodes"}}.
func (e *Env) CertConfig(u User) (*rest.Config, error) {
	if u.Name == "" {
		return nil, errors.New("testenv: CertConfig: empty user name")
	}
	certPEM, keyPEM, err := e.ca.issue(pkix.Name{CommonName: u.Name, Organization: u.Groups}, false, nil, nil)
	if err != nil {
		return nil, err
	}
	return &rest.Config{
		Host: e.host(),
		TLSClientConfig: rest.TLSClientConfig{
			CAData: e.ca.certPEM, CertData: certPEM, KeyData: keyPEM,
		},
	}, nil
}

// NodeConfig is CertConfig for node's kubelet: user system:node:{node}
// in group system:nodes, as the Node authorizer and NodeRestriction know
// a kubelet.
func (e *Env) NodeConfig(node string) (*rest.Config, error) {
	cfg, err := e.CertConfig(User{Name: "system:node:" + node, Groups: []string{"system:nodes"}})
	if err != nil {
		return nil, fmt.Errorf("issuing node %s's client certificate: %w", node, err)
	}
	return cfg, nil
}

// Port is the apiserver's secure port, on every address it binds.
func (e *Env) Port() int { return e.apiPort }

// CAFile is the environment's CA certificate (PEM), which signed the
// apiserver's serving certificate and every client certificate: a
// controller manager's --root-ca-file, which it publishes to every
// namespace as kube-root-ca.crt.
func (e *Env) CAFile() string { return e.path("ca.crt") }

// ServiceAccountKeyFile is the private key (PEM) the apiserver signs
// service account tokens with and whose public half verifies them: a
// controller manager's --service-account-private-key-file.
func (e *Env) ServiceAccountKeyFile() string { return e.path("sa.key") }

func (e *Env) host() string { return "https://" + hostPort(e.apiPort) }

func (e *Env) tokenConfig(token string) *rest.Config {
	return &rest.Config{
		Host:            e.host(),
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: e.ca.certPEM},
	}
}

// httpClient trusts the environment's CA, for the readiness probe.
func (e *Env) httpClient() *http.Client {
	pool := x509.NewCertPool()
	pool.AddCert(e.ca.cert)
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		DisableKeepAlives: true,
	}}
}

func (e *Env) path(name string) string { return filepath.Join(e.dir, name) }

// logTails returns the last n lines of both logs, for a failed test.
func (e *Env) logTails(n int) string {
	return fmt.Sprintf("kube-apiserver log (last %d lines):\n%s\netcd log (last %d lines):\n%s",
		n, tail(e.path("kube-apiserver.log"), n), n, tail(e.path("etcd.log"), n))
}

func randomToken() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("testenv: generate token: %w", err)
	}
	return hex.EncodeToString(b), nil
}
