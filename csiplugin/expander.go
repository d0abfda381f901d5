package csiplugin

import (
	"context"
	"errors"
	"fmt"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodevol/nodevol/csi"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// NodeExpand grows a published volume to req.Size with NodeExpandVolume,
// as the kubelet's CSI expander does after the controller has grown the
// volume. expanded is false when the driver does not implement node
// expansion (nothing to do on the node).
//
// The request carries what the kubelet sends: for a filesystem volume the
// pod's volume path and the staging path; for a block volume the pod's
// publish path (the device file the driver published,
// volumeDevices/publish/{specName}/{podUID}) and the block staging path,
// with a block capability, so the driver grows the device and no
// filesystem. The staging path is set whenever the driver stages.
//
// The error unwraps to the gRPC status of a failed call, and to the
// contract's class of a refusal (volume.ErrInfeasible,
// volume.ErrNotWhileInUse: see expandErrorClass).
func (p *plugin) NodeExpand(ctx context.Context, req volume.ExpandRequest) (expanded bool, err error) {
	spec := req.Spec
	fail := func(err error) (bool, error) {
		return false, fmt.Errorf("expanding volume %s to %d bytes: %w", volumeDesc(spec), req.Size, err)
	}
	client, err := p.drivers.Client(spec.Driver)
	if err != nil {
		return fail(err)
	}
	if !client.Capabilities().Expand {
		return false, nil
	}
	volumePath, stagingPath := req.VolumePath, req.StagingPath
	if spec.Mode == podvol.Block {
		_, paths, err := p.blockPaths(spec, req.Pod)
		if err != nil {
			return fail(err)
		}
		volumePath, stagingPath = paths.PublishPath, ""
		if client.Capabilities().StageUnstage {
			stagingPath = paths.StagingPath
		}
	}
	secrets, err := p.secretData(ctx, spec.NodeExpandSecret, "NodeExpand", expandSecretWords)
	if err != nil {
		return fail(err)
	}
	_, err = client.Bound(p.timeout, p.steps).NodeExpandVolume(ctx, &csipb.NodeExpandVolumeRequest{
		VolumeId:          spec.VolumeHandle,
		VolumePath:        volumePath,
		StagingTargetPath: stagingPath,
		CapacityRange:     &csipb.CapacityRange{RequiredBytes: req.Size},
		VolumeCapability:  volumeCapability(spec, client.Capabilities(), nil),
		Secrets:           secrets,
	})
	if err != nil {
		// The kubelet's words: an infeasible request's with no colon.
		class := expandErrorClass(err)
		words := "Expander.NodeExpand failed to expand the volume : "
		if class == volume.ErrInfeasible {
			words = "Expander.NodeExpand failed to expand the volume "
		}
		err = kubeletWords(words, err)
		if class != nil {
			err = classed{err: err, class: class}
		}
		return fail(err)
	}
	return true, nil
}

// expandErrorClass is the contract's class of a failed NodeExpandVolume,
// as the kubelet's node expander reads its gRPC code: volume.ErrInfeasible
// for a request the driver refuses (InvalidArgument, OutOfRange,
// NotFound), volume.ErrNotWhileInUse for a volume it cannot expand while
// published (FailedPrecondition); nil for any other error, whose class it
// carries already (volume.ErrInProgress) or which is a final failure.
func expandErrorClass(err error) error {
	if errors.Is(err, volume.ErrInProgress) || errors.Is(err, volume.ErrNotReady) {
		return nil
	}
	var ce *csi.CallError
	if !errors.As(err, &ce) {
		return nil
	}
	switch status.Code(ce) {
	case codes.InvalidArgument, codes.OutOfRange, codes.NotFound:
		return volume.ErrInfeasible
	case codes.FailedPrecondition:
		return volume.ErrNotWhileInUse
	}
	return nil
}

// classed is err, also matching class (errors.Is), with err's text.
type classed struct{ err, class error }

func (e classed) Error() string   { return e.err.Error() }
func (e classed) Unwrap() []error { return []error{e.err, e.class} }
