package csiplugin

import (
	"context"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/nodevol/nodevol/cache"
)

// ExpandRequest is a mounted volume to grow on the node.
type ExpandRequest struct {
	Spec *cache.VolumeSpec
	// VolumePath is where the volume is published for one of its pods and
	// StagingPath where it is staged ("" when the driver does not stage).
	VolumePath, StagingPath string
	// Size is the new size in bytes: the PV's capacity.
	Size int64
}

// NodeExpand grows a mounted volume's filesystem to req.Size with
// NodeExpandVolume, as the kubelet's CSI expander does after the
// controller has grown the volume. expanded is false when the driver does
// not implement node expansion (nothing to do on the node).
func (p *Plugin) NodeExpand(ctx context.Context, req ExpandRequest) (expanded bool, err error) {
	spec := req.Spec
	fail := func(err error) (bool, error) {
		return false, fmt.Errorf("expanding volume %s to %d bytes: %w", volumeDesc(spec), req.Size, err)
	}
	client, err := p.drivers.Client(spec.Driver)
	if err != nil {
		return fail(err)
	}
	if !client.caps.Expand {
		return false, nil
	}
	secrets, err := p.secretData(ctx, spec.NodeExpandSecret, "NodeExpand")
	if err != nil {
		return fail(err)
	}
	_, err = client.withTimeout(p.timeout).NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{
		VolumeId:          spec.VolumeHandle,
		VolumePath:        req.VolumePath,
		StagingTargetPath: req.StagingPath,
		CapacityRange:     &csi.CapacityRange{RequiredBytes: req.Size},
		VolumeCapability:  volumeCapability(spec, client.caps, nil),
		Secrets:           secrets,
	})
	if err != nil {
		return fail(err)
	}
	return true, nil
}
