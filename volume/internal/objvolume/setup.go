package objvolume

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/internal/atomicwriter"
	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/volume"
)

// SetUp implements volume.Mounter: it reads the volume's object, makes
// its files (the kubelet's MakePayload), sets the wrapped emptyDir up (a
// tmpfs of the resolved size for a Memory kind) and writes the files with
// the atomic writer and the pod's fsGroup, and returns the volume's path.
// Run again for a volume already set up, it changes nothing unless the
// files changed, and then switches them atomically.
//
// Errors, as the kubelet classes them: a missing object (unless the source
// is optional: the volume is then empty), a missing key of a source that
// is not optional, a read that failed and a key or path the writer
// refuses are returned before anything is made or changed; the old
// content stays, and the volume manager retries (with backoff, and when
// the object changes). An error once the directory exists wraps
// volume.ErrInProgress; the writer leaves the old version visible or the
// new one, never a mix.
func (p *Plugin) SetUp(ctx context.Context, req volume.MountRequest) (string, error) {
	vol := req.Volume
	fail := func(err error) (string, error) {
		return "", fmt.Errorf("setting up %s volume %q of pod %s: %w", p.kind.Title, vol.SpecName, vol.Pod, err)
	}
	src, err := p.source(req.Spec)
	if err != nil {
		return fail(err)
	}
	var tmpfsSize int64
	if p.kind.Memory {
		if tmpfsSize, err = size(req.Spec); err != nil {
			return fail(err)
		}
	}
	files, err := p.payload(ctx, vol.Pod.Namespace, src)
	if err != nil {
		return fail(err)
	}
	dir, err := p.Wrapper.SetUp(ctx, vol, p.kind.Memory, tmpfsSize)
	if err != nil {
		return "", err
	}
	w, release, err := p.Writer(dir, vol.FSGroup)
	if err != nil {
		return fail(fmt.Errorf("%w: %w", err, volume.ErrInProgress))
	}
	defer release()
	changed, err := w.Write(ctx, files)
	if err != nil {
		return fail(fmt.Errorf("%s %s/%s: %w: %w", p.kind.Resource, vol.Pod.Namespace, src.Name, err, volume.ErrInProgress))
	}
	if changed {
		klog.FromContext(ctx).V(4).Info("Wrote the volume's files", "plugin", p.kind.Name, "pod", vol.Pod.String(),
			"volume", vol.SpecName, "object", src.Name, "files", len(files))
	}
	return dir, nil
}

// payload reads src's object in namespace ns and returns its files, every
// path checked.
func (p *Plugin) payload(ctx context.Context, ns string, src Source) (map[string]atomicwriter.File, error) {
	optional := src.Optional != nil && *src.Optional
	obj, err := p.objects.Get(ctx, objectcache.Ref{Kind: p.kind.Object, Namespace: ns, Name: src.Name})
	switch {
	case apierrors.IsNotFound(err) && optional:
		obj = nil // an empty volume, as the kubelet writes one
	case apierrors.IsNotFound(err):
		// The kubelet's text: its managers name the kind in the singular.
		return nil, volume.Cause(apierrors.NewNotFound(schema.GroupResource{Resource: p.kind.Resource}, src.Name))
	case err != nil:
		return nil, fmt.Errorf("reading %s %s/%s: %w", p.kind.Resource, ns, src.Name, err)
	}
	object := fmt.Sprintf("%s %s/%s", p.kind.Resource, ns, src.Name)
	files, err := p.kind.Payload(obj, atomicwriter.Items{Items: src.Items, DefaultMode: src.DefaultMode, Optional: optional})
	if err != nil {
		// The kubelet's MakePayload's words ("configmap references
		// non-existent config key: k").
		return nil, fmt.Errorf("%s: %w", object, volume.Cause(err))
	}
	if err := checkPaths(files, src); err != nil {
		return nil, fmt.Errorf("%s: %w", object, err)
	}
	return files, nil
}

// checkPaths checks the paths of files before anything is written: a key
// that is its own file's name (no items) must be one valid file name; an
// item's path one the writer takes.
func checkPaths(files map[string]atomicwriter.File, src Source) error {
	if len(src.Items) > 0 {
		for _, it := range src.Items {
			if _, ok := files[it.Path]; !ok {
				continue // an optional key that is missing
			}
			if err := atomicwriter.ValidatePath(it.Path); err != nil {
				return fmt.Errorf("key %q to path %q: %w", it.Key, it.Path, err)
			}
		}
		return nil
	}
	return atomicwriter.ValidateKeys(files)
}
