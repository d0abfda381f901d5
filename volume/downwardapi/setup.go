package downwardapi

import (
	"context"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/volume"
)

// SetUp implements volume.Mounter: it sets up the volume's tmpfs (once) and
// writes the files ResolveSpec computed, with the pod's fsGroup, through
// the atomic writer: a container sees the old files or the new ones, never
// a mix, and files equal to what is there change nothing. Idempotent; it
// runs again at every resync. An error once the tmpfs is set up wraps
// volume.ErrInProgress; the files a failed write would have replaced stay.
func (p *plugin) SetUp(ctx context.Context, req volume.MountRequest) (string, error) {
	vol := req.Volume
	if req.Spec == nil {
		return "", fmt.Errorf("setting up downwardAPI volume %q of pod %s: no spec", vol.SpecName, vol.Pod)
	}
	payload, size, err := decode(req.Spec.Attributes)
	if err != nil {
		return "", fmt.Errorf("setting up downwardAPI volume %q of pod %s: %w", vol.SpecName, vol.Pod, err)
	}
	dir, err := p.Wrapper.SetUp(ctx, vol, true, size)
	if err != nil {
		return "", err
	}
	// From here on the tmpfs is mounted: an error leaves the volume
	// Uncertain, to be set up again or torn down.
	w, release, err := p.Writer(dir, vol.FSGroup)
	if err != nil {
		return "", fmt.Errorf("writing downwardAPI volume %q of pod %s: %w: %w", vol.SpecName, vol.Pod, err, volume.ErrInProgress)
	}
	defer release()
	changed, err := w.Write(ctx, payload)
	if err != nil {
		return "", fmt.Errorf("writing downwardAPI volume %q of pod %s: %w: %w", vol.SpecName, vol.Pod, err, volume.ErrInProgress)
	}
	if changed {
		klog.FromContext(ctx).V(4).Info("DownwardAPI volume written", "pod", vol.Pod, "volume", vol.SpecName, "files", len(payload), "path", dir)
	}
	return dir, nil
}
