package csiplugin

// The credentials a driver gets with a request: the Secret a PV names
// (NodeStage, NodePublish, NodeExpand) and the pod's service account
// tokens that a CSIDriver's tokenRequests ask for (NodePublish).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/nodevol/nodevol/internal/tokens"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// secretGetter reads a Secret. A missing Secret is an error for which
// apierrors.IsNotFound holds.
type secretGetter interface {
	GetSecret(ctx context.Context, namespace, name string) (*v1.Secret, error)
}

// newSecretGetter returns a secretGetter that GETs Secrets from the API
// server, as the kubelet does (Secrets are not watched node-wide).
func newSecretGetter(client kubernetes.Interface) secretGetter {
	if client == nil {
		return noSecrets{}
	}
	return clientSecrets{client}
}

type clientSecrets struct{ client kubernetes.Interface }

func (s clientSecrets) GetSecret(ctx context.Context, namespace, name string) (*v1.Secret, error) {
	return s.client.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
}

// noSecrets is the secretGetter of a plugin configured without one.
type noSecrets struct{}

var errNoSecretGetter = errors.New("the CSI plugin has no secretGetter configured")

func (noSecrets) GetSecret(context.Context, string, string) (*v1.Secret, error) {
	return nil, errNoSecretGetter
}

// secretData reads the Secret ref points to and returns its data as CSI
// secrets. No ref gives nil. A missing Secret is a final error (it is not
// watched: the operation is retried on the next resync), with the
// kubelet's words for it (words: one of the *SecretWords, secretCause);
// other failures to read it wrap ErrNotReady. Secret values never appear
// in errors or logs.
func (p *plugin) secretData(ctx context.Context, ref *podvol.SecretRef, what, words string) (map[string]string, error) {
	if ref == nil {
		return nil, nil
	}
	s, err := p.secrets.GetSecret(ctx, ref.Namespace, ref.Name)
	switch {
	case apierrors.IsNotFound(err), errors.Is(err, errNoSecretGetter):
		return nil, volume.WithCause(fmt.Errorf("%s secret %s/%s not found: %w", what, ref.Namespace, ref.Name, err), secretCause(words, ref, err))
	case err != nil:
		return nil, fmt.Errorf("reading %s secret %s/%s: %w (%w)", what, ref.Namespace, ref.Name, err, volume.ErrNotReady)
	}
	data := make(map[string]string, len(s.Data)+len(s.StringData))
	for k, v := range s.StringData {
		data[k] = v
	}
	for k, v := range s.Data {
		data[k] = string(v)
	}
	return data, nil
}

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
func (p *plugin) addServiceAccountTokens(ctx context.Context, driver *storagev1.CSIDriver, pod podvol.PodRef, req *requestMaps) error {
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
