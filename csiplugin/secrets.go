package csiplugin

import (
	"context"
	"errors"
	"fmt"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodevol/nodevol/cache"
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
func (p *plugin) secretData(ctx context.Context, ref *cache.SecretRef, what, words string) (map[string]string, error) {
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
