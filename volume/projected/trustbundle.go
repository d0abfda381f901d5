package projected

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"

	certificatesv1 "k8s.io/api/certificates/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
)

// errZeroBundles is the kubelet's error for a signer's selection that
// matched no bundle.
var errZeroBundles = errors.New("combination of signerName and labelSelector matched zero ClusterTrustBundles")

// trustAnchors returns the PEM file of a clusterTrustBundle source: the
// bundle by name, or the bundles of the signer that the label selector
// selects (none without a selector), each certificate once. A missing
// bundle or an empty selection is an empty file for an optional source,
// else the kubelet's error. An API server that does not serve the API the
// cache reads is an error, optional or not (objectcache.ErrNotServed: not
// NotFound, so never taken for a missing bundle).
func (c *collector) trustAnchors(ctx context.Context, src *v1.ClusterTrustBundleProjection) ([]byte, error) {
	optional := src.Optional != nil && *src.Optional
	ref, ok, err := trustBundleRef(src)
	switch {
	case err != nil:
		return nil, err
	case !ok && src.Name == nil && src.SignerName == nil:
		return nil, errors.New("ClusterTrustBundle projection requires either name or signerName to be set")
	case !ok && optional: // a signer with no label selector selects nothing
		return []byte{}, nil
	case !ok:
		return nil, errZeroBundles
	}
	var bundles []runtime.Object
	if src.Name != nil {
		obj, err := c.p.objects.Get(ctx, ref)
		switch {
		case apierrors.IsNotFound(err) && optional:
			return []byte{}, nil
		case apierrors.IsNotFound(err):
			return nil, fmt.Errorf("while getting ClusterTrustBundle: %w",
				apierrors.NewNotFound(certificatesv1.Resource("clustertrustbundle"), *src.Name)) // as the kubelet's lister names it
		case err != nil:
			return nil, fmt.Errorf("while getting ClusterTrustBundle %s: %w", *src.Name, err)
		}
		bundles = []runtime.Object{obj}
	} else {
		all, err := c.p.objects.List(ctx, ref)
		if err != nil {
			return nil, fmt.Errorf("while listing ClusterTrustBundles of signer %s matching label selector %q: %w", *src.SignerName, ref.Labels, err)
		}
		// The cache selects on the signer already; this keeps the file
		// right should it send more.
		for _, o := range all {
			if b, ok := o.(*certificatesv1.ClusterTrustBundle); ok && b.Spec.SignerName == *src.SignerName {
				bundles = append(bundles, b)
			}
		}
		if len(bundles) == 0 {
			if optional {
				return []byte{}, nil
			}
			return nil, errZeroBundles
		}
	}
	return normalize(bundles)
}

// normalize returns the certificates of bundles as one PEM file, as the
// kubelet's normalizeTrustAnchors does: every PEM block of each bundle,
// each distinct content once, written as a CERTIFICATE block with no
// headers; sorted by content (the kubelet then shuffles them, which would
// rewrite the file with nothing changed: see the package documentation).
func normalize(bundles []runtime.Object) ([]byte, error) {
	seen := map[string]bool{}
	var ders []string
	for _, o := range bundles {
		b, ok := o.(*certificatesv1.ClusterTrustBundle)
		if !ok {
			return nil, fmt.Errorf("while normalizing trust anchors: read a %T, not a ClusterTrustBundle", o)
		}
		rest := []byte(b.Spec.TrustBundle)
		for {
			var block *pem.Block
			block, rest = pem.Decode(rest)
			if block == nil {
				break
			}
			if der := string(block.Bytes); !seen[der] {
				seen[der] = true
				ders = append(ders, der)
			}
		}
	}
	slices.Sort(ders)
	out := []byte{}
	for _, der := range ders {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte(der)})...)
	}
	return out, nil
}
