package projected

import (
	"context"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/volume"
)

// SetUp implements volume.Mounter: it gathers the files of every source
// (objects from the object cache, the token from the token cache, the
// downward API files ResolveSpec computed), then sets the volume's tmpfs
// up (once) and writes the files with the pod's fsGroup through the
// atomic writer, and returns the volume's path. Run again for a volume set
// up already, it changes nothing unless a file changed, and then switches
// them atomically: a container sees the old files or the new, never a mix.
//
// Errors: a source that cannot be read (a missing object or key of a
// source that is not optional, a token refused, a selection of no trust
// bundles, a pod certificate not issued yet) is reported, with every other
// source's error, before anything is made or changed; the old content
// stays and the volume manager retries. An error once the tmpfs is set up
// wraps volume.ErrInProgress.
func (p *plugin) SetUp(ctx context.Context, req volume.MountRequest) (string, error) {
	vol := req.Volume
	fail := func(err error) (string, error) {
		return "", fmt.Errorf("setting up projected volume %q of pod %s: %w", vol.SpecName, vol.Pod, err)
	}
	src, err := source(req.Spec)
	if err != nil {
		return fail(err)
	}
	res, err := decode(req.Spec.Attributes)
	if err != nil {
		return fail(err)
	}
	c := collector{p: p, vol: vol, src: src, res: res}
	payload, err := c.collect(ctx)
	if err != nil {
		return fail(err)
	}
	dir, err := p.Wrapper.SetUp(ctx, vol, true, res.size)
	if err != nil {
		return "", err
	}
	// From here on the tmpfs is mounted: an error leaves the volume
	// Uncertain, to be set up again or torn down.
	w, release, err := p.Writer(dir, vol.FSGroup)
	if err != nil {
		return fail(fmt.Errorf("%w: %w", err, volume.ErrInProgress))
	}
	defer release()
	changed, err := w.Write(ctx, payload)
	if err != nil {
		return fail(fmt.Errorf("%w: %w", err, volume.ErrInProgress))
	}
	if changed {
		klog.FromContext(ctx).V(4).Info("Projected volume written", "pod", vol.Pod.String(), "volume", vol.SpecName, "files", len(payload), "path", dir)
	}
	return dir, nil
}
