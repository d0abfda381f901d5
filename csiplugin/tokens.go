package csiplugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/nodevol/nodevol/cache"
	"github.com/nodevol/nodevol/internal/tokens"
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
// server and hands out each again until it is due for a refresh (package
// internal/tokens), so that republishing a volume does not ask for a new
// token every time.
func newTokenGetter(client kubernetes.Interface, src TokenSource, clk clock.PassiveClock) tokenGetter {
	switch {
	case src != nil:
		return cachedTokens{src}
	case client == nil:
		return noTokens{}
	}
	return cachedTokens{tokens.New(client, clk)}
}

// TokenSource issues service account tokens through the TokenRequest API
// and tells when each is due for a refresh (internal/tokens.Cache).
type TokenSource interface {
	ServiceAccountToken(ctx context.Context, namespace, name string, tr *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, time.Time, error)
}

// cachedTokens is a TokenSource as a tokenGetter.
type cachedTokens struct{ c TokenSource }

func (t cachedTokens) ServiceAccountToken(ctx context.Context, namespace, name string, tr *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error) {
	out, _, err := t.c.ServiceAccountToken(ctx, namespace, name, tr)
	return out, err
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
