package csiplugin

import (
	"context"
	"errors"
	"fmt"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodevol/nodevol/cache"
	"github.com/nodevol/nodevol/csi"
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
// The error unwraps to the gRPC status of a failed call; ExpandFailure
// says what it means for the claim.
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
	if spec.Mode == cache.Block {
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
		words := "Expander.NodeExpand failed to expand the volume : "
		if ClassifyExpandError(err) == ExpandInfeasible {
			words = "Expander.NodeExpand failed to expand the volume "
		}
		return fail(kubeletWords(words, err))
	}
	return true, nil
}

// ExpandFailure is what a failed node expansion means for the claim, as
// the kubelet's node expander decides it.
type ExpandFailure int

const (
	// ExpandTransient: the call may still be running, or did not reach
	// the driver (not registered, timed out): the claim is not touched
	// and the expansion is retried.
	ExpandTransient ExpandFailure = iota
	// ExpandFailed: the driver failed for good this time (Internal, ...):
	// the claim gets the NodeResizeError condition and the expansion is
	// retried with backoff.
	ExpandFailed
	// ExpandInfeasible: the driver refuses the request (InvalidArgument,
	// OutOfRange, NotFound): the claim's storage resize status becomes
	// NodeResizeInfeasible, and nothing retries until the claim changes.
	ExpandInfeasible
	// ExpandInUse: the driver cannot expand the volume while it is in use
	// (FailedPrecondition): the claim gets NodeResizeError; the mount goes
	// on, and this node does not try again at that size.
	ExpandInUse
)

// ClassifyExpandError says what err, returned by NodeExpand, means.
func ClassifyExpandError(err error) ExpandFailure {
	if errors.Is(err, volume.ErrInProgress) || errors.Is(err, volume.ErrNotReady) {
		return ExpandTransient
	}
	var ce *csi.CallError
	if !errors.As(err, &ce) {
		return ExpandFailed
	}
	switch status.Code(ce) {
	case codes.InvalidArgument, codes.OutOfRange, codes.NotFound:
		return ExpandInfeasible
	case codes.FailedPrecondition:
		return ExpandInUse
	}
	return ExpandFailed
}
