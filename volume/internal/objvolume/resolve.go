package objvolume

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"

	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/internal/atomicwriter"
	"github.com/nodevol/nodevol/podvol"
)

// attrSize is the key of a tmpfs volume's size in bytes (decimal; "0":
// unbounded) in spec.Attributes.
const attrSize = "sizeBytes"

// maxMode is the largest mode a source may give, as API validation allows.
const maxMode = 0o777

// ResolveSpec implements volume.SpecResolver: it checks what the pod spec
// gives as the API server would have (an object name, modes between 0 and
// 0777, item keys and paths: relative, no "..", no two items at one path
// or one below another) and, for a tmpfs volume, stores its size in
// spec.Attributes. Errors name the pod, the volume and the cause.
func (p *Plugin) ResolveSpec(pod *v1.Pod, spec *podvol.VolumeSpec) error {
	if pod == nil || spec == nil {
		return fmt.Errorf("resolving a %s volume: nil pod or spec", p.kind.Title)
	}
	fail := func(err error) error {
		return fmt.Errorf("%s volume %s of pod %s/%s: %w", p.kind.Title, spec.Name, pod.Namespace, pod.Name, err)
	}
	src, err := p.source(spec)
	if err != nil {
		return fail(err)
	}
	if src.Name == "" {
		return fail(fmt.Errorf("the source names no %s", p.kind.Title))
	}
	if err := checkMode("defaultMode", src.DefaultMode); err != nil {
		return fail(err)
	}
	if err := checkItems(src.Items); err != nil {
		return fail(err)
	}
	if p.kind.Memory {
		size, err := p.Wrapper.MemorySize(pod)
		if err != nil {
			return fail(err)
		}
		spec.Attributes = map[string]string{attrSize: strconv.FormatInt(size, 10)}
	}
	return nil
}

// checkMode checks a mode of the source named field.
func checkMode(field string, mode *int32) error {
	if mode != nil && (*mode < 0 || *mode > maxMode) {
		return fmt.Errorf("%s %#o: must be between 0 and 0777", field, *mode)
	}
	return nil
}

// checkItems checks the items of a source: a key each, a path the writer
// takes, a valid mode, and paths that can all be files at once.
func checkItems(items []v1.KeyToPath) error {
	paths := make([]string, 0, len(items))
	for i, it := range items {
		if it.Key == "" {
			return fmt.Errorf("items[%d]: no key", i)
		}
		if err := atomicwriter.ValidatePath(it.Path); err != nil {
			return fmt.Errorf("items[%d] (key %q): %w", i, it.Key, err)
		}
		if err := checkMode(fmt.Sprintf("items[%d] (key %q) mode", i, it.Key), it.Mode); err != nil {
			return err
		}
		paths = append(paths, path.Clean(it.Path))
	}
	slices.Sort(paths)
	for i := 1; i < len(paths); i++ {
		if paths[i] == paths[i-1] {
			return fmt.Errorf("two items have the path %s", paths[i])
		}
	}
	if a, b, ok := atomicwriter.Nested(paths); ok {
		return fmt.Errorf("item path %s is a file and a directory of item path %s", a, b)
	}
	return nil
}

// size returns a tmpfs volume's size, as ResolveSpec stored it.
func size(spec *podvol.VolumeSpec) (int64, error) {
	s, ok := spec.Attributes[attrSize]
	if !ok {
		return 0, errNotResolved
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, errors.New("the spec's tmpfs size " + strconv.Quote(s) + " is not a byte count")
	}
	return n, nil
}
