package projected

import (
	"context"
	"errors"
	"fmt"
	"path"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"

	"github.com/nodevol/nodevol/internal/atomicwriter"
	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// collector gathers the files of one volume's sources, as the kubelet's
// collectData does.
type collector struct {
	p   *plugin
	vol podvol.PodVolume
	src *v1.ProjectedVolumeSource
	res resolved
}

// collect returns the volume's files, keyed by cleaned path: each source's
// files in order, a later source's file replacing an earlier one at the
// same path as in the kubelet. Every source's error is reported,
// aggregated as the kubelet aggregates them, and no files with one.
func (c *collector) collect(ctx context.Context) (map[string]atomicwriter.File, error) {
	payload := map[string]atomicwriter.File{}
	var errs []error
	for i := range c.src.Sources {
		files, err := c.source(ctx, i, &c.src.Sources[i])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for p, f := range files {
			payload[path.Clean(p)] = f
		}
	}
	if len(errs) == 0 {
		return payload, nil
	}
	// The kubelet's words: its aggregate of each source's.
	words := make([]error, len(errs))
	for i, err := range errs {
		_, cause := volume.EventCause(err)
		words[i] = errors.New(cause)
	}
	kubelet := utilerrors.NewAggregate(words).Error()
	if len(errs) == 1 {
		return nil, volume.WithCause(errs[0], kubelet) // as the kubelet's aggregate prints it, and errors.As still sees it
	}
	return nil, volume.WithCause(utilerrors.NewAggregate(errs), kubelet)
}

// source returns the files of source i.
func (c *collector) source(ctx context.Context, i int, s *v1.VolumeProjection) (map[string]atomicwriter.File, error) {
	switch {
	case s.ConfigMap != nil:
		return c.object(ctx, objectcache.ConfigMap, "configmap", s.ConfigMap.Name, s.ConfigMap.Items, s.ConfigMap.Optional)
	case s.Secret != nil:
		return c.object(ctx, objectcache.Secret, "secret", s.Secret.Name, s.Secret.Items, s.Secret.Optional)
	case s.DownwardAPI != nil:
		return c.res.downward[i], nil
	case s.ServiceAccountToken != nil:
		return c.token(ctx, s.ServiceAccountToken)
	case s.ClusterTrustBundle != nil:
		data, err := c.trustAnchors(ctx, s.ClusterTrustBundle)
		if err != nil {
			return nil, err
		}
		return map[string]atomicwriter.File{s.ClusterTrustBundle.Path: c.file(data, s.ClusterTrustBundle.User)}, nil
	case s.PodCertificate != nil:
		return c.podCertificate(ctx, i, s.PodCertificate)
	}
	return nil, nil
}

// file is a token, trust bundle or certificate file: the kubelet's owner
// and mode rule for them.
func (c *collector) file(data []byte, user *int64) atomicwriter.File {
	owner := atomicwriter.FileUser(c.p.userFields, c.res.fsUser, c.src.DefaultUser, user)
	return atomicwriter.File{Data: data, Mode: atomicwriter.ProjectedMode(*c.src.DefaultMode, owner, c.vol.FSGroup), FSUser: owner}
}

// object returns the files of a configMap or secret source.
func (c *collector) object(ctx context.Context, kind objectcache.Kind, resource, name string, items []v1.KeyToPath, opt *bool) (map[string]atomicwriter.File, error) {
	ns := c.vol.Pod.Namespace
	optional := opt != nil && *opt
	obj, err := c.p.objects.Get(ctx, objectcache.Ref{Kind: kind, Namespace: ns, Name: name})
	switch {
	case apierrors.IsNotFound(err) && optional:
		obj = nil // adds nothing, as the kubelet's empty object
	case apierrors.IsNotFound(err):
		// The kubelet's text: its managers name the kind in the singular.
		return nil, apierrors.NewNotFound(schema.GroupResource{Resource: resource}, name)
	case err != nil:
		return nil, fmt.Errorf("reading %s %s/%s: %w", resource, ns, name, err)
	}
	it := atomicwriter.Items{Items: items, DefaultMode: c.src.DefaultMode, DefaultUser: c.src.DefaultUser, Optional: optional, UserFields: c.p.userFields}
	files, err := payloadOf(obj, it)
	if err != nil {
		// The kubelet's MakePayload's words.
		return nil, fmt.Errorf("%s %s/%s: %w", resource, ns, name, volume.Cause(err))
	}
	if err := checkKeys(files, items); err != nil {
		return nil, fmt.Errorf("%s %s/%s: %w", resource, ns, name, err)
	}
	return files, nil
}

// payloadOf is the kubelet's MakePayload of a configMap or secret (nil: a
// missing optional one).
func payloadOf(obj runtime.Object, it atomicwriter.Items) (map[string]atomicwriter.File, error) {
	switch o := obj.(type) {
	case nil:
		return atomicwriter.SecretPayload(nil, it)
	case *v1.ConfigMap:
		return atomicwriter.ConfigMapPayload(o, it)
	case *v1.Secret:
		return atomicwriter.SecretPayload(o, it)
	}
	return nil, fmt.Errorf("read a %T, not a ConfigMap or a Secret", obj)
}

// checkKeys refuses, before anything is written, a key that is its own
// file's name (no items) and is not one valid file name: the API server
// refuses such keys, and one with a "/" would write below the volume's
// top level.
func checkKeys(files map[string]atomicwriter.File, items []v1.KeyToPath) error {
	if len(items) > 0 {
		return nil // the paths were checked by ResolveSpec
	}
	return atomicwriter.ValidateKeys(files)
}

// token returns the file of a serviceAccountToken source: a token of the
// pod's service account, bound to the pod.
func (c *collector) token(ctx context.Context, src *v1.ServiceAccountTokenProjection) (map[string]atomicwriter.File, error) {
	pod := c.vol.Pod
	sa := pod.ServiceAccount
	if sa == "" {
		sa = "default"
	}
	exp := int64(defaultTokenSeconds)
	if src.ExpirationSeconds != nil {
		exp = *src.ExpirationSeconds
	}
	var auds []string
	if src.Audience != "" {
		auds = []string{src.Audience}
	}
	tr, _, err := c.p.tokens.ServiceAccountToken(ctx, pod.Namespace, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			Audiences:         auds,
			ExpirationSeconds: &exp,
			BoundObjectRef:    &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID},
		},
	})
	if err != nil {
		// The kubelet's token manager's words, without the account.
		return nil, volume.WithCause(fmt.Errorf("failed to fetch token: service account %s/%s: %w", pod.Namespace, sa, err), "failed to fetch token: "+err.Error())
	}
	return map[string]atomicwriter.File{src.Path: c.file([]byte(tr.Status.Token), src.User)}, nil
}

// errNoPodCertificates is the error of a podCertificate source on a plugin
// configured without pod certificates.
var errNoPodCertificates = errors.New("podCertificate projection: no pod certificate manager is configured on this node")

// podCertificate returns the files of a podCertificate source.
func (c *collector) podCertificate(ctx context.Context, i int, src *v1.PodCertificateProjection) (map[string]atomicwriter.File, error) {
	if c.p.certs == nil {
		return nil, fmt.Errorf("sources[%d]: %w", i, errNoPodCertificates)
	}
	key, chain, err := c.p.certs.Credentials(ctx, c.vol.Pod, c.vol.SpecName, i, src)
	if err != nil {
		return nil, fmt.Errorf("podCertificate projection sources[%d] (signer %s): %w", i, src.SignerName, err)
	}
	files := map[string]atomicwriter.File{}
	if src.CredentialBundlePath != "" {
		bundle := append(append(make([]byte, 0, len(key)+len(chain)), key...), chain...)
		files[src.CredentialBundlePath] = c.file(bundle, src.User)
	}
	if src.KeyPath != "" {
		files[src.KeyPath] = c.file(key, src.User)
	}
	if src.CertificateChainPath != "" {
		files[src.CertificateChainPath] = c.file(chain, src.User)
	}
	return files, nil
}
