// Package tokens issues service account tokens for the pods of the node
// through the TokenRequest API and hands each out again until it is due
// for a refresh, as the kubelet's token manager does: when 80% of its
// lifetime has passed, or 24 hours, whichever comes first. The CSI plugin
// gives them to drivers whose CSIDriver lists tokenRequests; the projected
// volume plugin writes them into serviceAccountToken files.
package tokens

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// MaxAge bounds how long a token is handed out, whatever its expiry: the
// kubelet's maxTTL.
const MaxAge = 24 * time.Hour

// Cache issues tokens and keeps each until it is due for a refresh. It is
// safe for concurrent use.
type Cache struct {
	client kubernetes.Interface
	clock  clock.PassiveClock

	mu     sync.Mutex
	tokens map[string]token
}

type token struct {
	tr       *authenticationv1.TokenRequest
	issuedAt time.Time
	pod      types.UID
}

// New returns a cache that creates tokens through client. clk defaults to
// the real clock.
func New(client kubernetes.Interface, clk clock.PassiveClock) *Cache {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Cache{client: client, clock: clk, tokens: map[string]token{}}
}

// ServiceAccountToken returns a token of service account namespace/name
// for request tr (audiences, expirationSeconds, the object it is bound
// to): the one issued earlier for the same request while it is not due for
// a refresh, else a new one from the API server; if the API server refuses
// or fails that refresh, the one issued earlier while it has not expired
// (its refreshAt, now past), as the kubelet's token manager does. refreshAt
// is when it is due: the caller writes it out again then.
func (c *Cache) ServiceAccountToken(ctx context.Context, namespace, name string, tr *authenticationv1.TokenRequest) (out *authenticationv1.TokenRequest, refreshAt time.Time, err error) {
	key := key(namespace, name, tr)
	now := c.clock.Now()
	c.mu.Lock()
	for k, t := range c.tokens { // drop expired tokens: their pods may be gone
		if !now.Before(t.tr.Status.ExpirationTimestamp.Time) {
			delete(c.tokens, k)
		}
	}
	t, ok := c.tokens[key]
	c.mu.Unlock()
	if ok && now.Before(t.refreshAt()) {
		return t.tr.DeepCopy(), t.refreshAt(), nil
	}
	out, err = c.client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, tr, metav1.CreateOptions{})
	if err != nil && ok {
		// The token held has not expired (expired ones were dropped
		// above): hand it out, as the kubelet does, rather than fail the
		// volume's other files with it; the next call tries again.
		klog.FromContext(ctx).Error(err, "Couldn't refresh service account token, handing out the one held",
			"namespace", namespace, "serviceAccount", name, "expiration", t.tr.Status.ExpirationTimestamp.Time)
		return t.tr.DeepCopy(), t.refreshAt(), nil
	}
	if err != nil {
		return nil, time.Time{}, err
	}
	t = token{tr: out.DeepCopy(), issuedAt: now}
	if r := tr.Spec.BoundObjectRef; r != nil && r.Kind == "Pod" {
		t.pod = r.UID
	}
	c.mu.Lock()
	c.tokens[key] = t
	c.mu.Unlock()
	return out, t.refreshAt(), nil
}

// Forget drops the tokens bound to pod, which is gone (the kubelet's
// DeleteServiceAccountToken).
func (c *Cache) Forget(pod types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, t := range c.tokens {
		if t.pod == pod {
			delete(c.tokens, k)
		}
	}
}

// refreshAt is when t is due for a refresh: 80% of its lifetime after it
// was issued, at most MaxAge.
func (t token) refreshAt() time.Time {
	life := t.tr.Status.ExpirationTimestamp.Sub(t.issuedAt)
	return t.issuedAt.Add(min(life*8/10, MaxAge))
}

func key(namespace, name string, tr *authenticationv1.TokenRequest) string {
	var exp int64
	if tr.Spec.ExpirationSeconds != nil {
		exp = *tr.Spec.ExpirationSeconds
	}
	var bound string
	if r := tr.Spec.BoundObjectRef; r != nil {
		bound = r.Kind + "/" + r.Name + "/" + string(r.UID)
	}
	return fmt.Sprintf("%s/%s/%s/%d/%s", namespace, name, strings.Join(tr.Spec.Audiences, ","), exp, bound)
}
