package podcert

import (
	"context"
	"fmt"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/podvol"
)

// phase is where a source is in the kubelet's state machine:
//
//	new -> waiting -> issued -> renewing -> issued ...
//	          |                   |
//	          +--> denied, failed <+
type phase int

const (
	phaseNew      phase = iota // no request yet
	phaseWaiting               // the first request is pending
	phaseIssued                // a credential, no renewal pending
	phaseRenewing              // a credential, and a renewal pending
	phaseDenied                // permanent: the signer denied a request
	phaseFailed                // permanent: the signer could not issue
)

// source is the state of one podCertificate source. Its fields are guarded by
// Manager.mu; only the loop changes them, Forget removes it.
type source struct {
	pod podvol.PodRef
	src v1.PodCertificateProjection

	phase phase
	cred  Credential
	// Of the current credential.
	beginRefreshAt, refreshAt, notAfter time.Time
	overdueNoted, expiredNoted          bool

	// The pending request, and the key it asks a certificate for.
	pendingName string
	pendingKey  []byte
	abandonAt   time.Time

	// Why the source is denied or failed, and by which request.
	request, reason, message string

	failures int   // consecutive failed creations
	lastErr  error // of the last failed creation
}

// event is a Warning event about a pod.
type event struct {
	pod             podvol.PodRef
	reason, message string
}

// process moves source k on.
func (m *Manager) process(ctx context.Context, k key) {
	m.mu.Lock()
	rec := m.recs[k]
	if rec == nil {
		m.mu.Unlock()
		return
	}
	now := m.clock.Now()
	ph := rec.phase
	renew := ph == phaseIssued && !now.Before(rec.refreshAt)
	var late []event
	if ph == phaseRenewing || renew {
		var next time.Time
		late, next = rec.lateness(now)
		if !next.IsZero() {
			m.scheduleLocked(k, next)
		}
	}
	if ph == phaseIssued && !renew {
		m.scheduleLocked(k, rec.refreshAt)
	}
	m.mu.Unlock()
	m.emit(late...)

	switch {
	case ph == phaseNew, renew:
		m.request(ctx, k, rec)
	case ph == phaseWaiting, ph == phaseRenewing:
		m.check(ctx, k, rec)
	}
}

// lateness returns the events due at now about a credential whose renewal
// has not come (overdue 10 minutes after beginRefreshAt, expired at
// notAfter), each once, and when the next one will be due.
func (r *source) lateness(now time.Time) (events []event, next time.Time) {
	overdue := r.beginRefreshAt.Add(overdueAfter)
	if !r.overdueNoted {
		if !now.Before(overdue) {
			r.overdueNoted = true
			events = append(events, event{r.pod, "CertificateOverdueForRefresh", "PodCertificate refresh overdue"})
		} else {
			next = overdue
		}
	}
	if !r.expiredNoted {
		if !now.Before(r.notAfter) {
			r.expiredNoted = true
			events = append(events, event{r.pod, "CertificateExpired", "PodCertificate expired"})
		} else if next.IsZero() || r.notAfter.Before(next) {
			next = r.notAfter
		}
	}
	return events, next
}

// request creates a request for rec, its first or a renewal.
func (m *Manager) request(ctx context.Context, k key, rec *source) {
	logger := klog.FromContext(ctx)
	m.mu.Lock()
	pod, src := rec.pod, rec.src
	renewal := rec.phase == phaseIssued
	m.mu.Unlock()

	name, keyPEM, err := m.create(ctx, pod, &src)

	m.mu.Lock()
	defer m.mu.Unlock()
	if m.recs[k] != rec {
		return // forgotten meanwhile
	}
	now := m.clock.Now()
	if err != nil {
		rec.failures++
		rec.lastErr = err
		m.scheduleLocked(k, now.Add(retry.Delay(rec.failures)))
		logger.Error(err, "Creating a PodCertificateRequest failed", "pod", pod, "volume", k.volume, "sourceIndex", k.index, "failures", rec.failures)
		return
	}
	rec.failures, rec.lastErr = 0, nil
	rec.pendingName, rec.pendingKey = name, keyPEM
	rec.abandonAt = now.Add(abandonAfter + m.jitter(abandonJitter))
	rec.phase = phaseWaiting
	if renewal {
		rec.phase = phaseRenewing
	}
	m.pending[pod.Namespace+"/"+name] = k
	// The informer may have seen the request before it was recorded as
	// pending: look at once.
	m.scheduleLocked(k, now)
	logger.V(4).Info("PodCertificateRequest created", "pod", pod, "volume", k.volume, "sourceIndex", k.index, "request", name, "renewal", renewal)
}

// create makes a new key and a PodCertificateRequest for it, and returns
// the request's name and the PEM-encoded key.
func (m *Manager) create(ctx context.Context, pod podvol.PodRef, src *v1.PodCertificateProjection) (string, []byte, error) {
	sa, err := m.client.CoreV1().ServiceAccounts(pod.Namespace).Get(ctx, pod.ServiceAccount, metav1.GetOptions{})
	if err != nil {
		return "", nil, fmt.Errorf("reading service account %s/%s: %w", pod.Namespace, pod.ServiceAccount, err)
	}
	nodeUID, err := m.node(ctx)
	if err != nil {
		return "", nil, err
	}
	keyPEM, csr, err := keyAndProof(src.KeyType)
	if err != nil {
		return "", nil, err
	}
	pcr := &certificatesv1.PodCertificateRequest{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:    pod.Namespace,
			GenerateName: "req-",
			OwnerReferences: []metav1.OwnerReference{
				{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID},
			},
		},
		Spec: certificatesv1.PodCertificateRequestSpec{
			SignerName:                src.SignerName,
			PodName:                   pod.Name,
			PodUID:                    pod.UID,
			ServiceAccountName:        pod.ServiceAccount,
			ServiceAccountUID:         sa.UID,
			NodeName:                  types.NodeName(m.nodeName),
			NodeUID:                   nodeUID,
			MaxExpirationSeconds:      src.MaxExpirationSeconds,
			StubPKCS10Request:         csr,
			UnverifiedUserAnnotations: src.UserAnnotations,
		},
	}
	out, err := m.client.CertificatesV1().PodCertificateRequests(pod.Namespace).Create(ctx, pcr, metav1.CreateOptions{})
	if err != nil {
		// The node may have been registered again under a new UID.
		m.mu.Lock()
		m.nodeUID = ""
		m.mu.Unlock()
		return "", nil, fmt.Errorf("creating a PodCertificateRequest for signer %q: %w", src.SignerName, err)
	}
	return out.Name, keyPEM, nil
}

// node returns the UID of the node's Node, read once.
func (m *Manager) node(ctx context.Context) (types.UID, error) {
	m.mu.Lock()
	uid := m.nodeUID
	m.mu.Unlock()
	if uid != "" {
		return uid, nil
	}
	n, err := m.client.CoreV1().Nodes().Get(ctx, m.nodeName, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("reading node %s: %w", m.nodeName, err)
	}
	m.mu.Lock()
	m.nodeUID = n.UID
	m.mu.Unlock()
	return n.UID, nil
}

// check looks at rec's pending request as the informer last saw it.
func (m *Manager) check(ctx context.Context, k key, rec *source) {
	logger := klog.FromContext(ctx)
	m.mu.Lock()
	name := rec.pod.Namespace + "/" + rec.pendingName
	m.mu.Unlock()
	obj, found, _ := m.informer.GetStore().GetByKey(name) // a cache store's lookup does not fail

	m.mu.Lock()
	if m.recs[k] != rec || rec.pod.Namespace+"/"+rec.pendingName != name {
		m.mu.Unlock()
		return
	}
	now := m.clock.Now()
	if !found {
		if now.Before(rec.abandonAt) {
			m.scheduleLocked(k, rec.abandonAt)
		} else {
			// Deleted (or never seen, which the kubelet takes for the
			// same after the wait): ask again.
			m.dropPendingLocked(rec)
			if rec.phase == phaseWaiting {
				rec.phase = phaseNew
			} else {
				rec.phase = phaseIssued // its refresh time has passed
			}
			m.scheduleLocked(k, now)
			logger.V(2).Info("PodCertificateRequest is gone, making a new one", "pod", rec.pod, "volume", k.volume, "sourceIndex", k.index, "request", name)
		}
		m.mu.Unlock()
		return
	}
	ev, changed := m.applyLocked(k, rec, obj.(*certificatesv1.PodCertificateRequest), now)
	pod := rec.pod
	m.mu.Unlock()
	if ev != nil {
		m.emit(*ev)
	}
	if changed {
		logger.V(2).Info("PodCertificateRequest answered", "pod", pod, "volume", k.volume, "sourceIndex", k.index, "request", name)
		if m.onChange != nil {
			m.onChange(k.pod)
		}
	}
}

// applyLocked moves rec on by the conditions of its pending request pcr:
// whether the source changed (issued, denied, failed), and the event to
// send.
func (m *Manager) applyLocked(k key, rec *source, pcr *certificatesv1.PodCertificateRequest, now time.Time) (*event, bool) {
	name := pcr.Namespace + "/" + pcr.Name
	for _, c := range pcr.Status.Conditions {
		switch c.Type {
		case certificatesv1.PodCertificateRequestConditionTypeDenied, certificatesv1.PodCertificateRequestConditionTypeFailed:
			return m.endLocked(rec, name, c.Type, c.Reason, c.Message), true
		case certificatesv1.PodCertificateRequestConditionTypeIssued:
			chain := cleanChain(pcr.Status.CertificateChain)
			if len(chain) == 0 || pcr.Status.BeginRefreshAt == nil || pcr.Status.NotAfter == nil {
				return m.endLocked(rec, name, certificatesv1.PodCertificateRequestConditionTypeFailed, "InvalidIssuance",
					"issued without a certificate chain, beginRefreshAt or notAfter"), true
			}
			rec.cred = Credential{PrivateKey: rec.pendingKey, CertificateChain: chain}
			rec.beginRefreshAt = pcr.Status.BeginRefreshAt.Time
			rec.notAfter = pcr.Status.NotAfter.Time
			rec.refreshAt = rec.beginRefreshAt.Add(m.jitter(refreshJitter))
			if rec.notAfter.Before(rec.refreshAt) {
				rec.refreshAt = rec.notAfter
			}
			rec.overdueNoted, rec.expiredNoted = false, false
			rec.phase = phaseIssued
			m.dropPendingLocked(rec)
			m.scheduleLocked(k, rec.refreshAt)
			return nil, true
		}
	}
	return nil, false
}

// endLocked makes rec denied or failed (condition typ), for good.
func (m *Manager) endLocked(rec *source, request, typ, reason, message string) *event {
	rec.phase = phaseFailed
	verb := "failed"
	if typ == certificatesv1.PodCertificateRequestConditionTypeDenied {
		rec.phase = phaseDenied
		verb = "was denied"
	}
	rec.request, rec.reason, rec.message = request, reason, message
	rec.cred = Credential{}
	m.dropPendingLocked(rec)
	return &event{rec.pod, typ, fmt.Sprintf("PodCertificateRequest %s %s, reason=%q, message=%q", request, verb, reason, message)}
}

// dropPendingLocked forgets rec's pending request and its key.
func (m *Manager) dropPendingLocked(rec *source) {
	if rec.pendingName != "" {
		delete(m.pending, rec.pod.Namespace+"/"+rec.pendingName)
	}
	rec.pendingName, rec.pendingKey, rec.abandonAt = "", nil, time.Time{}
}

// emit sends events to the recorder, if any.
func (m *Manager) emit(events ...event) {
	if m.events == nil {
		return
	}
	for _, e := range events {
		ref := &v1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: e.pod.Namespace, Name: e.pod.Name, UID: e.pod.UID}
		m.events.Event(ref, v1.EventTypeWarning, e.reason, e.message)
	}
}
