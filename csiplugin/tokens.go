package csiplugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/nodevol/nodevol/cache"
)

// serviceAccountTokensKey is the key under which a driver whose CSIDriver
// lists tokenRequests gets the pod's service account tokens: a JSON map
// from audience to {token, expirationTimestamp}, in the volume context, or
// in the secrets when the CSIDriver sets serviceAccountTokenInSecrets.
const serviceAccountTokensKey = "csi.storage.k8s.io/serviceAccount.tokens"

// tokenGetter issues service account tokens (the TokenRequest API).
type tokenGetter interface {
	ServiceAccountToken(ctx context.Context, namespace, name string, tr *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error)
}

// newTokenGetter returns a tokenGetter that creates tokens through the API
// server and hands out each again until 80% of its lifetime has passed (at
// most 24 hours), as the kubelet's token manager does, so that republishing
// a volume does not ask for a new token every time.
func newTokenGetter(client kubernetes.Interface, clk clock.PassiveClock) tokenGetter {
	if client == nil {
		return noTokens{}
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &tokenCache{client: client, clock: clk, tokens: map[string]cachedToken{}}
}

type tokenCache struct {
	client kubernetes.Interface
	clock  clock.PassiveClock

	mu     sync.Mutex
	tokens map[string]cachedToken
}

type cachedToken struct {
	tr       *authenticationv1.TokenRequest
	issuedAt time.Time
}

// maxTokenAge bounds how long a token is handed out, whatever its expiry.
const maxTokenAge = 24 * time.Hour

func (c *tokenCache) ServiceAccountToken(ctx context.Context, namespace, name string, tr *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error) {
	key := tokenKey(namespace, name, tr)
	now := c.clock.Now()
	c.mu.Lock()
	for k, t := range c.tokens { // drop expired tokens: their pods may be gone
		if !now.Before(t.tr.Status.ExpirationTimestamp.Time) {
			delete(c.tokens, k)
		}
	}
	t, ok := c.tokens[key]
	c.mu.Unlock()
	if ok && fresh(t, now) {
		return t.tr.DeepCopy(), nil
	}
	out, err := c.client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, tr, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.tokens[key] = cachedToken{tr: out.DeepCopy(), issuedAt: now}
	c.mu.Unlock()
	return out, nil
}

// fresh reports whether t may be handed out again at now.
func fresh(t cachedToken, now time.Time) bool {
	exp := t.tr.Status.ExpirationTimestamp.Time
	life := exp.Sub(t.issuedAt)
	return now.Before(exp) && now.Sub(t.issuedAt) < life*8/10 && now.Sub(t.issuedAt) < maxTokenAge
}

func tokenKey(namespace, name string, tr *authenticationv1.TokenRequest) string {
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

// noTokens is the tokenGetter of a plugin configured without one.
type noTokens struct{}

func (noTokens) ServiceAccountToken(_ context.Context, namespace, name string, _ *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error) {
	return nil, fmt.Errorf("service account token for %s/%s: %w", namespace, name, errNoTokenGetter)
}

var errNoTokenGetter = errors.New("no tokenGetter configured (csiplugin.Config.Tokens)")

// addServiceAccountTokens requests the tokens the driver's CSIDriver asks
// for (tokenRequests), bound to the pod, and adds them to req under
// serviceAccountTokensKey: in the secrets when the CSIDriver sets
// serviceAccountTokenInSecrets, in the volume context otherwise. The maps
// in req are copied before they change: they may be the spec's.
func (p *plugin) addServiceAccountTokens(ctx context.Context, driver *storagev1.CSIDriver, pod cache.PodRef, req *requestMaps) error {
	if driver == nil || len(driver.Spec.TokenRequests) == 0 {
		return nil
	}
	sa := pod.ServiceAccount
	if sa == "" {
		sa = "default" // what the API server sets when a pod names none
	}
	out := map[string]authenticationv1.TokenRequestStatus{}
	for _, r := range driver.Spec.TokenRequests {
		audiences := []string{}
		if r.Audience != "" {
			audiences = []string{r.Audience}
		}
		tr, err := p.tokens.ServiceAccountToken(ctx, pod.Namespace, sa, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{
				Audiences:         audiences,
				ExpirationSeconds: r.ExpirationSeconds,
				BoundObjectRef:    &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID},
			},
		})
		if err != nil {
			return fmt.Errorf("requesting a token of service account %s/%s for audience %q (CSIDriver %s tokenRequests): %w",
				pod.Namespace, sa, r.Audience, driver.Name, err)
		}
		out[r.Audience] = tr.Status
	}
	tokens, err := json.Marshal(out)
	if err != nil {
		return err
	}
	if driver.Spec.ServiceAccountTokenInSecrets != nil && *driver.Spec.ServiceAccountTokenInSecrets {
		req.secrets = withKey(req.secrets, serviceAccountTokensKey, string(tokens))
	} else {
		req.volumeContext = withKey(req.volumeContext, serviceAccountTokensKey, string(tokens))
	}
	return nil
}

// requestMaps are the maps of a NodePublishVolume request that tokens go into.
type requestMaps struct {
	volumeContext, secrets map[string]string
}

// withKey returns a copy of m with k set to v.
func withKey(m map[string]string, k, v string) map[string]string {
	out := maps.Clone(m)
	if out == nil {
		out = map[string]string{}
	}
	out[k] = v
	return out
}
