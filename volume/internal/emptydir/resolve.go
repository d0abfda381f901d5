package emptydir

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// Keys of what ResolveSpec stores in spec.Attributes (see the package
// documentation).
const (
	attrMedium   = "medium"
	attrSize     = "sizeBytes"
	attrPageSize = "pageSize"
)

// mediumKind is what a medium sets up.
type mediumKind int

const (
	onDisk mediumKind = iota
	inMemory
	hugePages
)

// medium is a volume's medium, resolved: what SetUp needs.
type medium struct {
	kind mediumKind
	name v1.StorageMedium
	// size is a memory volume's tmpfs size in bytes, 0 for none.
	size int64
	// pageSize is a hugepages volume's page size, as its mount option
	// gives it ("2Mi").
	pageSize string
}

// ResolveSpec implements volume.SpecResolver: it checks the emptyDir
// source as the kubelet would refuse it, and stores what SetUp needs from
// the pod (a memory volume's tmpfs size, a hugepages volume's page size)
// in spec.Attributes. A negative sizeLimit (which API validation refuses),
// an unknown medium and a hugepages medium the pod's hugepage resources do
// not give one page size for are errors naming the pod, the volume and the
// cause.
func (p *plugin) ResolveSpec(pod *v1.Pod, spec *podvol.VolumeSpec) error {
	if pod == nil || spec == nil {
		return errors.New("resolving an emptyDir volume: nil pod or spec")
	}
	fail := func(err error) error {
		return fmt.Errorf("emptyDir volume %s of pod %s/%s: %w", spec.Name, pod.Namespace, pod.Name, err)
	}
	if spec.Source == nil || spec.Source.EmptyDir == nil {
		return fail(errors.New("the spec has no emptyDir source"))
	}
	src := spec.Source.EmptyDir
	if src.SizeLimit != nil && src.SizeLimit.Sign() < 0 {
		return fail(fmt.Errorf("sizeLimit %s is negative", src.SizeLimit))
	}
	attrs := map[string]string{attrMedium: string(src.Medium)}
	switch m := src.Medium; {
	case m == v1.StorageMediumDefault:
	case m == v1.StorageMediumMemory:
		alloc, err := p.allocatable()
		if err != nil {
			return fail(err)
		}
		if size := memorySize(alloc, podMemoryLimit(pod), src.SizeLimit); size > 0 {
			attrs[attrSize] = strconv.FormatInt(size, 10)
		}
	case isHugePageMedium(m):
		ps, err := hugePageSize(m, pod)
		if err != nil {
			return fail(volume.Cause(err)) // the kubelet's SetUp says so in these words
		}
		attrs[attrPageSize] = ps
	default:
		return fail(volume.Causef("unknown storage medium %q", m))
	}
	spec.Attributes = attrs
	return nil
}

// allocatable is the node's allocatable memory, 0 when no source of it is
// configured. A source that cannot say (the Node not read yet) is an error
// wrapping volume.ErrNotReady, as the kubelet fails the mount when it
// cannot read its node's allocatable resources: a tmpfs mounted meanwhile
// would have no bound at all.
func (p *plugin) allocatable() (int64, error) {
	if p.alloc == nil {
		return 0, nil
	}
	n, err := p.alloc()
	if err != nil {
		return 0, fmt.Errorf("error retrieving node: %w: %w", err, volume.ErrNotReady)
	}
	return max(n, 0), nil
}

// memorySize is a memory volume's tmpfs size, as the kubelet's
// calculateEmptyDirMemorySize: the smallest of the node's allocatable
// memory, the pod's memory limit and the volume's sizeLimit, counting
// each only when positive; 0 when none is.
func memorySize(allocatable, podLimit int64, sizeLimit *resource.Quantity) int64 {
	size := allocatable
	bound := func(n int64) {
		if n > 0 && (size <= 0 || n <= size) {
			size = n
		}
	}
	bound(podLimit)
	if sizeLimit != nil {
		bound(sizeLimit.Value())
	}
	return max(size, 0)
}

// mediumOf returns the resolved medium of spec: from its Attributes, or
// for a spec ResolveSpec did not see, from its source when that is on disk
// (a memory or hugepages volume needs the pod).
func mediumOf(spec *podvol.VolumeSpec) (medium, error) {
	name, resolved := spec.Attributes[attrMedium]
	if !resolved {
		if spec.Source == nil || spec.Source.EmptyDir == nil {
			return medium{}, errors.New("the spec has no emptyDir source")
		}
		if name = string(spec.Source.EmptyDir.Medium); name != "" {
			return medium{}, fmt.Errorf("medium %q needs the pod's resources, but the spec was not resolved from the pod", name)
		}
	}
	m := medium{name: v1.StorageMedium(name)}
	switch {
	case m.name == v1.StorageMediumDefault:
		m.kind = onDisk
	case m.name == v1.StorageMediumMemory:
		m.kind = inMemory
		if s, ok := spec.Attributes[attrSize]; ok {
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil || n <= 0 {
				return medium{}, fmt.Errorf("resolved tmpfs size %q is not a positive number of bytes", s)
			}
			m.size = n
		}
	case isHugePageMedium(m.name):
		m.kind = hugePages
		m.pageSize = spec.Attributes[attrPageSize]
		if m.pageSize == "" {
			return medium{}, fmt.Errorf("medium %s: the resolved spec has no page size", m.name)
		}
	default:
		return medium{}, fmt.Errorf("unknown storage medium %q", m.name)
	}
	return m, nil
}

// isHugePageMedium reports whether m is HugePages or HugePages-<size>.
func isHugePageMedium(m v1.StorageMedium) bool {
	return m == v1.StorageMediumHugePages || strings.HasPrefix(string(m), string(v1.StorageMediumHugePagesPrefix))
}
