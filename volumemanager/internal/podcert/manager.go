package podcert

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	certinformers "k8s.io/client-go/informers/certificates/v1"
	"k8s.io/client-go/kubernetes"
	k8scache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/nodevol/nodevol/internal/backoff"
	"github.com/nodevol/nodevol/internal/duequeue"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// The kubelet's timings.
const (
	// abandonAfter: a pending request not seen this long after its
	// creation (plus up to abandonJitter) is taken to have been deleted.
	abandonAfter  = 10 * time.Minute
	abandonJitter = 5 * time.Minute
	// refreshJitter: a credential is renewed up to this long after the
	// status's beginRefreshAt, so that the pods of a node do not all ask
	// at once.
	refreshJitter = 5 * time.Minute
	// overdueAfter: a renewal not issued this long after beginRefreshAt
	// is reported (CertificateOverdueForRefresh).
	overdueAfter = 10 * time.Minute
)

// retry is the wait before trying again after a failed request creation
// (a ServiceAccount or Node not readable, the API server refusing).
var retry = backoff.Policy{Initial: 500 * time.Millisecond, Max: 2*time.Minute + 2*time.Second, Jitter: backoff.APIJitter}

// Config configures a Manager.
type Config struct {
	// Client creates the PodCertificateRequests, watches the node's ones,
	// and reads the pods' ServiceAccounts and the node's Node. Required.
	Client kubernetes.Interface
	// Clock times renewals and retries. Default: the real clock.
	Clock clock.WithTicker
	// NodeName is the node's name: the requests carry it and the watch
	// selects on it. Required.
	NodeName string
	// OnChange is called, outside the Manager's locks, when a source of
	// the pod was issued a credential or a renewed one, or was denied or
	// failed: the pod's projected volumes are to be written again. It
	// must not block for long. nil: nobody is told.
	OnChange func(pod types.UID)
	// Recorder receives the kubelet's Warning events about a pod's
	// certificates. nil: no events.
	Recorder record.EventRecorder
}

// Request names one podCertificate source of one pod's projected volume.
type Request struct {
	// Pod is the pod; its namespace, name and service account are needed.
	Pod podvol.PodRef
	// Volume is the projected volume's name in pod.spec.volumes.
	Volume string
	// SourceIndex is the source's index in the volume's sources.
	SourceIndex int
	// Source is the source. A pod's volumes do not change: the first
	// Request of a source is the one used.
	Source *v1.PodCertificateProjection
}

func (r Request) String() string {
	return fmt.Sprintf("pod %s volume %q podCertificate source %d (signer %q)", r.Pod, r.Volume, r.SourceIndex, r.Source.SignerName)
}

// Credential is what a podCertificate source projects.
type Credential struct {
	// PrivateKey is one PKCS#8 "PRIVATE KEY" PEM block: the keyPath file.
	PrivateKey []byte
	// CertificateChain is the issued chain, "CERTIFICATE" PEM blocks with
	// the leaf first: the certificateChainPath file.
	CertificateChain []byte
}

// Bundle is the credentialBundlePath file: the key, then the chain.
func (c Credential) Bundle() []byte {
	return append(append(make([]byte, 0, len(c.PrivateKey)+len(c.CertificateChain)), c.PrivateKey...), c.CertificateChain...)
}

// Manager issues and renews the credentials of the podCertificate sources
// of the node's pods. Its methods are safe for concurrent use.
type Manager struct {
	client   kubernetes.Interface
	clock    clock.WithTicker
	nodeName string
	onChange func(types.UID)
	events   record.EventRecorder
	informer k8scache.SharedIndexInformer
	// jitter returns a random duration in [0, max); tests make it 0.
	jitter func(max time.Duration) time.Duration
	// waiting, for tests, is told each time the loop waits, with the time
	// it waits for (zero: only for a wake-up).
	waiting func(time.Time)
	wake    chan struct{}
	// needed is closed at the first Credentials call: Run watches the
	// node's requests only from then on, so that a node whose pods have
	// no podCertificate source asks the API server for nothing (an older
	// server may not serve the resource; the node's rights may not
	// cover it).
	needed     chan struct{}
	neededOnce sync.Once

	mu      sync.Mutex
	recs    map[key]*source
	pending map[string]key // "namespace/name" of each pending request
	// due is when each source is to be processed; its wake-up belongs
	// to Run's goroutine (next).
	due     *duequeue.Queue[key]
	nodeUID types.UID // read once; "" until then, and after a failed create
}

type key struct {
	pod    types.UID
	volume string
	index  int
}

// New returns a Manager; Run must run for it to issue anything.
func New(cfg Config) (*Manager, error) {
	if cfg.Client == nil {
		return nil, errors.New("podcert: Config.Client is required")
	}
	if cfg.NodeName == "" {
		return nil, errors.New("podcert: Config.NodeName is required")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	m := &Manager{
		client:   cfg.Client,
		clock:    cfg.Clock,
		nodeName: cfg.NodeName,
		onChange: cfg.OnChange,
		events:   cfg.Recorder,
		jitter:   func(max time.Duration) time.Duration { return rand.N(max) },
		wake:     make(chan struct{}, 1),
		needed:   make(chan struct{}),
		recs:     map[key]*source{},
		pending:  map[string]key{},
		due:      duequeue.New[key](cfg.Clock),
	}
	// The Node authorizer lets a node list and watch only the requests
	// that select it by spec.nodeName.
	m.informer = certinformers.NewFilteredPodCertificateRequestInformer(cfg.Client, metav1.NamespaceAll, 0, k8scache.Indexers{},
		func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", cfg.NodeName).String()
		})
	if _, err := m.informer.AddEventHandler(k8scache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { m.observed(obj, false) },
		UpdateFunc: func(_, obj any) { m.observed(obj, false) },
		DeleteFunc: func(obj any) { m.observed(obj, true) },
	}); err != nil {
		return nil, fmt.Errorf("podcert: watching PodCertificateRequests: %w", err)
	}
	return m, nil
}

// Run watches the node's PodCertificateRequests and creates, checks and
// renews requests until ctx is done, from the first Credentials call on;
// it returns after its goroutines have stopped. Run it once.
func (m *Manager) Run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	select {
	case <-ctx.Done():
		return
	case <-m.needed:
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { m.informer.RunWithContext(ctx) })
	if !k8scache.WaitForCacheSync(ctx.Done(), m.informer.HasSynced) {
		return
	}
	logger.V(2).Info("Pod certificate manager started", "node", m.nodeName)
	for {
		k, ok := m.next(ctx)
		if !ok {
			return
		}
		m.process(ctx, k)
	}
}

// Credentials returns the credential of the source req names, and starts
// issuing one if it has none yet. It does not block: until the first
// certificate is issued it returns an error wrapping volume.ErrNotReady,
// and OnChange tells when it is issued. A denied or failed request is a
// permanent error for the pod. While a renewal is pending, the current
// credential is returned.
func (m *Manager) Credentials(ctx context.Context, req Request) (Credential, error) {
	if err := req.validate(); err != nil {
		return Credential{}, err
	}
	m.neededOnce.Do(func() { close(m.needed) })
	k := key{pod: req.Pod.UID, volume: req.Volume, index: req.SourceIndex}
	m.mu.Lock()
	defer m.mu.Unlock()
	rec := m.recs[k]
	if rec == nil {
		rec = &source{pod: req.Pod, src: *req.Source.DeepCopy()}
		m.recs[k] = rec
		m.scheduleLocked(k, m.clock.Now())
		klog.FromContext(ctx).V(4).Info("Pod certificate source added", "pod", req.Pod, "volume", req.Volume, "sourceIndex", req.SourceIndex, "signer", req.Source.SignerName)
	}
	switch rec.phase {
	case phaseIssued, phaseRenewing:
		return Credential{
			PrivateKey:       append([]byte(nil), rec.cred.PrivateKey...),
			CertificateChain: append([]byte(nil), rec.cred.CertificateChain...),
		}, nil
	case phaseDenied:
		return Credential{}, fmt.Errorf("%s: PodCertificateRequest %s was permanently denied: reason=%q message=%q", req, rec.request, rec.reason, rec.message)
	case phaseFailed:
		return Credential{}, fmt.Errorf("%s: PodCertificateRequest %s was permanently failed: reason=%q message=%q", req, rec.request, rec.reason, rec.message)
	}
	detail := ""
	switch {
	case rec.lastErr != nil:
		detail = fmt.Sprintf(" (last attempt: %v)", rec.lastErr)
	case rec.pendingName != "":
		detail = fmt.Sprintf(" (PodCertificateRequest %s/%s is pending)", rec.pod.Namespace, rec.pendingName)
	}
	return Credential{}, fmt.Errorf("%s: credential bundle is not issued yet%s: %w", req, detail, volume.ErrNotReady)
}

func (r Request) validate() error {
	if r.Source == nil {
		return fmt.Errorf("pod %s volume %q podCertificate source %d: no source", r.Pod, r.Volume, r.SourceIndex)
	}
	if r.Pod.Namespace == "" || r.Pod.Name == "" || r.Pod.UID == "" {
		return fmt.Errorf("%s: the pod's namespace, name and UID are needed", r)
	}
	if r.Pod.ServiceAccount == "" {
		return fmt.Errorf("%s: the pod has no service account", r)
	}
	if r.Source.SignerName == "" {
		return fmt.Errorf("%s: no signerName", r)
	}
	if !knownKeyType(r.Source.KeyType) {
		return fmt.Errorf("%s: unknown key type %q", r, r.Source.KeyType)
	}
	return nil
}

// Forget drops the credentials of pod, which is gone, and stops issuing
// them: call it after the pod's last Credentials. Its pending requests are
// left to the garbage collector (they are owned by the pod) and to the
// kube-controller-manager's cleaner.
func (m *Manager) Forget(pod types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, rec := range m.recs {
		if k.pod == pod {
			m.dropPendingLocked(rec)
			delete(m.recs, k)
			m.due.Remove(k)
		}
	}
}

// observed wakes the source waiting for the request an informer event is
// about. A deleted pending request is made again at once.
func (m *Manager) observed(obj any, deleted bool) {
	if t, ok := obj.(k8scache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	pcr, ok := obj.(*certificatesv1.PodCertificateRequest)
	if !ok {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	k, ok := m.pending[pcr.Namespace+"/"+pcr.Name]
	if !ok {
		return
	}
	now := m.clock.Now()
	if rec := m.recs[k]; deleted && rec != nil {
		rec.abandonAt = now
	}
	m.scheduleLocked(k, now)
}

// scheduleLocked asks for k to be processed at at, or earlier if it is
// already due earlier.
func (m *Manager) scheduleLocked(k key, at time.Time) {
	if !m.due.SetEarlier(k, at) {
		return
	}
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// next returns the first source that is due, waiting for one; false when
// ctx is done.
func (m *Manager) next(ctx context.Context) (key, bool) {
	defer m.due.Stop()
	for {
		m.mu.Lock()
		// A wake-up sent before this point is for a time now in m.due.
		select {
		case <-m.wake:
		default:
		}
		if k, ok := m.due.Pop(); ok {
			m.mu.Unlock()
			return k, true
		}
		at := m.due.Next()
		m.due.Arm()
		fired := m.due.C()
		m.mu.Unlock()
		if m.waiting != nil {
			m.waiting(at)
		}
		select {
		case <-ctx.Done():
		case <-m.wake:
		case <-fired:
			m.due.Fired() // the wake-up is this goroutine's alone
		}
		if ctx.Err() != nil {
			return key{}, false
		}
	}
}
