package downwardapi

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/internal/atomicwriter"
	"github.com/nodevol/nodevol/internal/downward"
	"github.com/nodevol/nodevol/podvol"
)

// Keys and prefixes of what ResolveSpec stores in spec.Attributes (see the
// package documentation).
const (
	attrResolved = "resolved"
	attrSize     = "sizeBytes"
	prefixFile   = "file:"
	prefixMode   = "mode:"
	prefixUser   = "user:"
)

// ResolveSpec implements volume.SpecResolver: it computes the volume's
// files from pod (its metadata and its containers' resources) and stores
// them, with the tmpfs size, in spec.Attributes. An item the kubelet
// would fail on (an unsupported field path, an invalid key, an unknown
// container or resource), an invalid path and two paths that cannot both
// be files are errors naming the pod, the volume and the cause. A node
// whose allocatable resources cannot be read, when an item needs them, is
// an error wrapping volume.ErrNotReady.
func (p *plugin) ResolveSpec(pod *v1.Pod, spec *podvol.VolumeSpec) error {
	if pod == nil || spec == nil {
		return errors.New("resolving a downwardAPI volume: nil pod or spec")
	}
	fail := func(err error) error {
		return fmt.Errorf("downwardAPI volume %s of pod %s/%s: %w", spec.Name, pod.Namespace, pod.Name, err)
	}
	if spec.Source == nil || spec.Source.DownwardAPI == nil {
		return fail(errors.New("the spec has no downwardAPI source"))
	}
	src := spec.Source.DownwardAPI
	alloc, err := p.NodeAllocatable(src.Items)
	if err != nil {
		return fail(err)
	}
	payload, err := downward.Payload(pod, downward.Source{
		Items: src.Items, DefaultMode: defaultMode(src), DefaultUser: src.DefaultUser, UserFields: p.userFields,
	}, alloc)
	if err != nil {
		return fail(err)
	}
	if err := checkPaths(payload); err != nil {
		return fail(err)
	}
	size, err := p.Wrapper.MemorySize(pod)
	if err != nil {
		return fail(err)
	}
	spec.Attributes = encode(payload, size)
	return nil
}

// defaultMode returns src's defaultMode, or 0644 when it has none: the API
// server's default, which a pod built in Go (a library's user, a fake
// clientset) never went through. The kubelet fails such a volume (it
// never sees one); nodevol defaults it, as its configMap, secret and
// projected volumes do.
func defaultMode(src *v1.DownwardAPIVolumeSource) *int32 {
	if src.DefaultMode != nil {
		return src.DefaultMode
	}
	mode := v1.DownwardAPIVolumeSourceDefaultMode
	return &mode
}

// checkPaths refuses what the atomic writer would refuse at every SetUp:
// an invalid path (atomicwriter.ValidatePath, the kubelet's rules) and a
// path below another one, which cannot be both a file and a directory.
func checkPaths(payload map[string]atomicwriter.File) error {
	paths := make([]string, 0, len(payload))
	for p := range payload {
		if err := atomicwriter.ValidatePath(p); err != nil {
			return err
		}
		paths = append(paths, p)
	}
	slices.Sort(paths)
	if p, q, ok := atomicwriter.Nested(paths); ok {
		return fmt.Errorf("invalid path: %s is a file, so %s cannot be written below it", p, q)
	}
	return nil
}

// encode returns the attributes of payload and of a tmpfs of size bytes
// (0: unbounded).
func encode(payload map[string]atomicwriter.File, size int64) map[string]string {
	attrs := make(map[string]string, 2+2*len(payload))
	attrs[attrResolved] = "true"
	if size > 0 {
		attrs[attrSize] = strconv.FormatInt(size, 10)
	}
	for p, f := range payload {
		attrs[prefixFile+p] = string(f.Data)
		attrs[prefixMode+p] = strconv.FormatInt(int64(f.Mode), 8)
		if f.FSUser != nil {
			attrs[prefixUser+p] = strconv.FormatInt(*f.FSUser, 10)
		}
	}
	return attrs
}

// decode returns the payload and the tmpfs size that encode stored in
// attrs; a spec ResolveSpec did not see is an error.
func decode(attrs map[string]string) (map[string]atomicwriter.File, int64, error) {
	if attrs[attrResolved] != "true" {
		return nil, 0, errors.New("the spec was not resolved from the pod: the files are not known")
	}
	var size int64
	if s, ok := attrs[attrSize]; ok {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			return nil, 0, fmt.Errorf("resolved tmpfs size %q is not a positive number of bytes", s)
		}
		size = n
	}
	payload := map[string]atomicwriter.File{}
	for k, v := range attrs {
		p, ok := strings.CutPrefix(k, prefixFile)
		if !ok {
			continue
		}
		f := atomicwriter.File{Data: []byte(v)}
		mode, err := strconv.ParseInt(attrs[prefixMode+p], 8, 32)
		if err != nil {
			return nil, 0, fmt.Errorf("file %s: resolved mode %q: %w", p, attrs[prefixMode+p], err)
		}
		f.Mode = int32(mode)
		if u, ok := attrs[prefixUser+p]; ok {
			uid, err := strconv.ParseInt(u, 10, 64)
			if err != nil {
				return nil, 0, fmt.Errorf("file %s: resolved user %q: %w", p, u, err)
			}
			f.FSUser = &uid
		}
		payload[path.Clean(p)] = f
	}
	return payload, size, nil
}
