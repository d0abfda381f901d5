package projected

import (
	"errors"
	"fmt"
	"path"
	"slices"

	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/internal/atomicwriter"
	"github.com/nodevol/nodevol/internal/downward"
	"github.com/nodevol/nodevol/podvol"
)

// The bounds API validation puts on a source.
const (
	maxMode             = 0o777
	minTokenExpiration  = 10 * 60
	maxTokenExpiration  = 1 << 32
	defaultTokenSeconds = 3600
)

// ResolveSpec implements volume.SpecResolver: it checks the sources as the
// API server would have (one kind per source, names, paths, modes, the
// duplicate paths it refuses, a trust bundle by name or by signer), computes
// the files of the downwardAPI sources from pod, and stores them with the
// tmpfs size and the pod's FSUser in spec.Attributes (see the package
// documentation). Errors name the pod, the volume, the source and the
// cause; one wraps volume.ErrNotReady when an item needs the node's
// allocatable resources and they cannot be read.
func (p *plugin) ResolveSpec(pod *v1.Pod, spec *podvol.VolumeSpec) error {
	if pod == nil || spec == nil {
		return errors.New("resolving a projected volume: nil pod or spec")
	}
	fail := func(err error) error {
		return fmt.Errorf("projected volume %s of pod %s/%s: %w", spec.Name, pod.Namespace, pod.Name, err)
	}
	src, err := source(spec)
	if err != nil {
		return fail(err)
	}
	if err := checkSources(src); err != nil {
		return fail(err)
	}
	size, err := p.Wrapper.MemorySize(pod)
	if err != nil {
		return fail(err)
	}
	r := resolved{size: size, fsUser: atomicwriter.FSUser(pod), downward: map[int]map[string]atomicwriter.File{}}
	for i, s := range src.Sources {
		if s.DownwardAPI == nil {
			continue
		}
		alloc, err := p.NodeAllocatable(s.DownwardAPI.Items)
		if err != nil {
			return fail(fmt.Errorf("sources[%d]: %w", i, err))
		}
		files, err := downward.Payload(pod, downward.Source{
			Items: s.DownwardAPI.Items, DefaultMode: src.DefaultMode, DefaultUser: src.DefaultUser, UserFields: p.userFields,
		}, alloc)
		if err != nil {
			return fail(fmt.Errorf("sources[%d] (downwardAPI): %w", i, err))
		}
		r.downward[i] = files
	}
	spec.Attributes = r.encode()
	return nil
}

// source returns spec's projected source, its defaultMode defaulted (to
// 0644, as the API server defaults it) when a pod that skipped defaulting
// has none.
func source(spec *podvol.VolumeSpec) (*v1.ProjectedVolumeSource, error) {
	if spec == nil || spec.Source == nil || spec.Source.Projected == nil {
		return nil, errors.New("the spec has no projected source")
	}
	src := spec.Source.Projected
	if src.DefaultMode == nil {
		src = src.DeepCopy()
		mode := v1.ProjectedVolumeSourceDefaultMode
		src.DefaultMode = &mode
	}
	return src, nil
}

// checkSources checks src's sources as API validation does, with its
// texts where it has one.
func checkSources(src *v1.ProjectedVolumeSource) error {
	if err := checkMode("defaultMode", src.DefaultMode); err != nil {
		return err
	}
	var (
		seen  = map[string]bool{} // the paths API validation compares
		paths []string            // every path known before SetUp
	)
	add := func(i int, p string, dupChecked bool) error {
		if err := atomicwriter.ValidatePath(p); err != nil {
			return fmt.Errorf("sources[%d]: path %q: %w", i, p, err)
		}
		if dupChecked {
			if seen[p] {
				return fmt.Errorf("sources[%d]: path %s: conflicting duplicate paths", i, p)
			}
			seen[p] = true
		}
		paths = append(paths, path.Clean(p))
		return nil
	}
	for i := range src.Sources {
		s := &src.Sources[i]
		if n := kinds(s); n > 1 {
			return fmt.Errorf("sources[%d]: may not specify more than 1 volume type per source", i)
		}
		sourcePaths, err := checkSource(i, s)
		if err != nil {
			return err
		}
		for _, sp := range sourcePaths {
			if err := add(i, sp, s.ServiceAccountToken == nil); err != nil {
				return err
			}
		}
	}
	return checkNesting(paths)
}

// checkSource checks one source and returns the paths it gives, when they
// are known before SetUp (not a configMap's or a secret's keys).
func checkSource(i int, s *v1.VolumeProjection) ([]string, error) {
	at := func(err error) error { return fmt.Errorf("sources[%d]: %w", i, err) }
	switch {
	case s.ConfigMap != nil:
		if s.ConfigMap.Name == "" {
			return nil, at(errors.New("configMap: the source names no configMap"))
		}
		return itemPaths(i, s.ConfigMap.Items)
	case s.Secret != nil:
		if s.Secret.Name == "" {
			return nil, at(errors.New("secret: the source names no secret"))
		}
		return itemPaths(i, s.Secret.Items)
	case s.DownwardAPI != nil:
		var out []string
		for j, it := range s.DownwardAPI.Items {
			if err := checkMode(fmt.Sprintf("downwardAPI items[%d] mode", j), it.Mode); err != nil {
				return nil, at(err)
			}
			out = append(out, it.Path)
		}
		return out, nil
	case s.ServiceAccountToken != nil:
		if e := s.ServiceAccountToken.ExpirationSeconds; e != nil && (*e < minTokenExpiration || *e > maxTokenExpiration) {
			return nil, at(fmt.Errorf("serviceAccountToken: expirationSeconds %d: must be between 10 minutes and 2^32 seconds", *e))
		}
		return []string{s.ServiceAccountToken.Path}, nil
	case s.ClusterTrustBundle != nil:
		return checkTrustBundle(i, s.ClusterTrustBundle)
	case s.PodCertificate != nil:
		c := s.PodCertificate
		out := slices.DeleteFunc([]string{c.CredentialBundlePath, c.KeyPath, c.CertificateChainPath}, func(p string) bool { return p == "" })
		if len(out) == 0 {
			return nil, at(errors.New("podCertificate: specify at least one of credentialBundlePath, keyPath, and certificateChainPath"))
		}
		return out, nil
	}
	return nil, nil
}

// checkTrustBundle checks a clusterTrustBundle source: a name or a signer
// name (and a valid label selector), not both.
func checkTrustBundle(i int, c *v1.ClusterTrustBundleProjection) ([]string, error) {
	at := func(err error) error { return fmt.Errorf("sources[%d]: clusterTrustBundle: %w", i, err) }
	switch {
	case c.Name != nil && c.SignerName != nil:
		return nil, at(errors.New("only one of name and signerName may be used"))
	case c.Name != nil && *c.Name == "":
		return nil, at(errors.New("name: must be a valid object name"))
	case c.Name != nil && c.LabelSelector != nil:
		return nil, at(errors.New("labelSelector must be unset if name is specified"))
	case c.Name == nil && (c.SignerName == nil || *c.SignerName == ""):
		// The kubelet's text, at each SetUp.
		return nil, at(errors.New("ClusterTrustBundle projection requires either name or signerName to be set"))
	}
	if _, _, err := trustBundleRef(c); err != nil {
		return nil, at(err)
	}
	return []string{c.Path}, nil
}

// itemPaths checks the items of a configMap or secret source and returns
// their paths.
func itemPaths(i int, items []v1.KeyToPath) ([]string, error) {
	out := make([]string, 0, len(items))
	for j, it := range items {
		if it.Key == "" {
			return nil, fmt.Errorf("sources[%d]: items[%d]: no key", i, j)
		}
		if err := checkMode(fmt.Sprintf("sources[%d]: items[%d] (key %q) mode", i, j, it.Key), it.Mode); err != nil {
			return nil, err
		}
		out = append(out, it.Path)
	}
	return out, nil
}

// kinds counts the kinds of source s sets.
func kinds(s *v1.VolumeProjection) int {
	n := 0
	for _, set := range []bool{s.Secret != nil, s.ConfigMap != nil, s.DownwardAPI != nil, s.ServiceAccountToken != nil,
		s.ClusterTrustBundle != nil, s.PodCertificate != nil} {
		if set {
			n++
		}
	}
	return n
}

// checkMode checks a mode of the source named field.
func checkMode(field string, mode *int32) error {
	if mode != nil && (*mode < 0 || *mode > maxMode) {
		return fmt.Errorf("%s %#o: must be between 0 and 0777", field, *mode)
	}
	return nil
}

// checkNesting refuses a path that is a directory of another: the writer
// would refuse the pair at every SetUp.
func checkNesting(paths []string) error {
	slices.Sort(paths)
	if a, b, ok := atomicwriter.Nested(paths); ok {
		return fmt.Errorf("path %s is a file and a directory of path %s", a, b)
	}
	return nil
}
