package volumemanager

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	fakeclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume/projected"
	"github.com/nodevol/nodevol/volumemanager/internal/podcert/podcerttest"
)

// certSigner plays the signer of the fake API server's
// PodCertificateRequests: it names each request as it is created (the
// fake does not do generateName) and, from a watch, issues it with a test
// CA (podcerttest.Issue: valid for an hour from the fake clock's now, to
// be refreshed after 30 minutes) or denies it, as a signer sets the status.
type certSigner struct {
	t      *testing.T
	client *fake.Clientset
	clock  *fakeclock.FakeClock
	deny   bool

	mu sync.Mutex
	// chains are the chains issued, by request name, as the node must
	// project them; requests counts the requests created.
	chains   map[string][]byte
	requests int
}

// newCertSigner adds the signer to client, before the manager uses it.
func newCertSigner(t *testing.T, client *fake.Clientset, clk *fakeclock.FakeClock, deny bool) *certSigner {
	s := &certSigner{t: t, client: client, clock: clk, deny: deny, chains: map[string][]byte{}}
	client.PrependReactor("create", "podcertificaterequests", func(a k8stesting.Action) (bool, runtime.Object, error) {
		pcr := a.(k8stesting.CreateAction).GetObject().(*certificatesv1.PodCertificateRequest)
		s.mu.Lock()
		s.requests++
		pcr.Name = fmt.Sprintf("req-%d", s.requests)
		s.mu.Unlock()
		return false, nil, nil // stored by the default reactor
	})
	w, err := client.CertificatesV1().PodCertificateRequests("").Watch(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if pcr, ok := ev.Object.(*certificatesv1.PodCertificateRequest); ok && ev.Type == watch.Added {
				s.sign(pcr)
			}
		}
	}()
	t.Cleanup(func() { w.Stop(); <-done })
	return s
}

// sign sets the status of pcr: issued, or denied.
func (s *certSigner) sign(pcr *certificatesv1.PodCertificateRequest) {
	now := s.clock.Now()
	status := podcerttest.Condition(certificatesv1.PodCertificateRequestConditionTypeDenied, "NotAllowed", "pods of service account app get no certificate", now)
	if !s.deny {
		var chain []byte
		var err error
		status, chain, err = podcerttest.Issue(pcr, now, now.Add(30*time.Minute), now.Add(time.Hour))
		if err != nil {
			s.t.Error(err)
			return
		}
		s.mu.Lock()
		s.chains[pcr.Name] = chain
		s.mu.Unlock()
	}
	pcr = pcr.DeepCopy()
	pcr.Status = status
	if _, err := s.client.CertificatesV1().PodCertificateRequests(pcr.Namespace).UpdateStatus(context.Background(), pcr, metav1.UpdateOptions{}); err != nil {
		s.t.Errorf("signing request %s: %v", pcr.Name, err)
	}
}

func (s *certSigner) chain(name string) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.chains[name]
}

func (s *certSigner) created() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

// certEnv is a manager on a fake clock whose API server has this node,
// the pod's service account and a signer; pod has a projected volume
// "certs" with a podCertificate source writing credentials.pem.
func certEnv(t *testing.T, deny bool) (*env, *certSigner, *fakeclock.FakeClock, *v1.Pod) {
	clk := fakeclock.NewFakeClock(time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC))
	client := fake.NewClientset(
		&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"}},
		&v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "app", UID: "sa-uid"}})
	signer := newCertSigner(t, client, clk, deny)
	e := newEnv(t, envOptions{client: client, clock: clk})
	pod := csitest.Pod("ns", "web", csitest.PodSpec{ServiceAccount: "app", Volumes: []csitest.PodVolume{{Name: "certs", Source: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{{
		PodCertificate: &v1.PodCertificateProjection{SignerName: "example.com/signer", KeyType: "ECDSAP256",
			MaxExpirationSeconds: ptr.To[int32](3600), CredentialBundlePath: "credentials.pem"}}}}}, ReadOnly: true}}})
	return e, signer, clk, pod
}

// TestPodCertificateVolume: a projected volume with a podCertificate
// source gets, once the signer issued the pod's request, the key and the
// chain in its credential bundle; at the certificate's refresh time (the
// manager's clock) a new key is requested and the file is written again
// with the new key and chain.
func TestPodCertificateVolume(t *testing.T) {
	e, signer, clk, pod := certEnv(t, false)
	if err := e.mount(pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(e.root, "pods", string(pod.UID), "volumes", "kubernetes.io~projected", "certs", "credentials.pem")
	first := checkCredentials(t, file, signer.chain("req-1"))

	// The refresh time: the manager's timer may be armed after the clock
	// moved (then for 30 minutes later), so the clock moves on until the
	// new request comes.
	refreshAt := clk.Now().Add(30 * time.Minute)
	eventually(t, "a new request at the refresh time", func() bool {
		if signer.created() >= 2 {
			return true
		}
		if clk.Now().Before(refreshAt) {
			clk.SetTime(refreshAt)
		} else {
			clk.Step(time.Minute)
		}
		return false
	})
	eventually(t, "the renewed credentials in the file", func() bool {
		data, _ := os.ReadFile(file)
		return signer.chain("req-2") != nil && bytes.HasSuffix(data, signer.chain("req-2"))
	})
	second := checkCredentials(t, file, signer.chain("req-2"))
	if bytes.Equal(first, second) {
		t.Errorf("the renewal kept the key")
	}
	e.unmount(pod)
}

// TestPodCertificateDenied: a request the signer denies leaves the pod's
// volume not set up, with an error naming the pod, the volume and the
// denial.
func TestPodCertificateDenied(t *testing.T) {
	e, _, _, pod := certEnv(t, true)
	e.vm.AddPod(pod)
	name := podvol.UniqueVolumeName(projected.PluginName + "/" + string(pod.UID) + "-certs")
	var lastErr error
	eventually(t, "the denial reported", func() bool {
		_, lastErr = backoffUntil(e.vm, name)
		return lastErr != nil && strings.Contains(lastErr.Error(), "denied")
	})
	for _, want := range []string{`projected volume "certs" of pod ns/web`, "req-1 was permanently denied",
		`reason="NotAllowed"`, "pods of service account app get no certificate"} {
		if !strings.Contains(lastErr.Error(), want) {
			t.Errorf("error %q does not name %q", lastErr, want)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var we *WaitError
	if err := e.vm.WaitForAttachAndMount(ctx, pod); !errors.As(err, &we) || !strings.Contains(err.Error(), "permanently denied") {
		t.Errorf("WaitForAttachAndMount = %v, want a WaitError with the denial", err)
	}
	if mvs := e.vm.GetMountedVolumesForPod(pod.UID); len(mvs) != 0 {
		t.Errorf("mounted volumes of the denied pod: %+v", mvs)
	}
	e.unmount(pod)
}

// checkCredentials checks that file holds a private key, then chain, and
// that the chain's leaf is for that key; it returns the key's PEM block.
func checkCredentials(t *testing.T, file string, chain []byte) []byte {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	block, rest := pem.Decode(data)
	if block == nil || block.Type != "PRIVATE KEY" || chain == nil || !bytes.Equal(rest, chain) {
		t.Fatalf("%s = %q, want a private key, then the chain issued %q", file, data, chain)
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	leafBlock, _ := pem.Decode(chain)
	leaf, err := x509.ParseCertificate(leafBlock.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if pub := key.(crypto.Signer).Public(); !reflect.DeepEqual(pub, leaf.PublicKey) {
		t.Errorf("the leaf certificate is not for the projected key")
	}
	return data[:len(data)-len(rest)]
}
