package csi

import (
	"context"
	"fmt"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"

	"github.com/nodevol/nodevol/step"
	"github.com/nodevol/nodevol/volume"
)

// DefaultCallTimeout bounds one CSI call when nothing else does: the
// kubelet's csiTimeout.
const DefaultCallTimeout = 2 * time.Minute

// NodeInfo is a driver's answer to NodeGetInfo.
type NodeInfo struct {
	// NodeID is the driver's ID of this node (the CSINode driver nodeID and
	// the csi.volume.kubernetes.io/nodeid annotation).
	NodeID string
	// MaxVolumesPerNode is 0 when the driver sets no limit.
	MaxVolumesPerNode int64
	// Topology is the node's accessible topology segments, if any.
	Topology map[string]string
}

// Client calls one registered driver's Node service over the driver's
// shared connection. Every call is bounded by the caller's context and by
// the client's call timeout, whichever ends first, and its error is
// classified once (see CallError). A Client is safe for concurrent use; it
// stays usable until the driver is deregistered or registered again, after
// which its calls fail with codes.Canceled.
type Client struct {
	driver  string
	conn    *grpc.ClientConn
	node    csipb.NodeClient
	caps    Capabilities
	timeout time.Duration
	// steps sees each call that changes the driver's state (bound).
	steps step.Hook
}

// Capabilities returns the node capabilities fetched at registration.
func (c *Client) Capabilities() Capabilities { return c.caps }

// Bound returns c with its call timeout lowered to d, if d is shorter,
// and with h seeing each call that changes the driver's state (h.Take
// is asked before each; its error is returned in place of the call).
func (c *Client) Bound(d time.Duration, h step.Hook) *Client {
	if (d <= 0 || d >= c.timeout) && h == nil {
		return c
	}
	cc := *c
	if d > 0 && d < c.timeout {
		cc.timeout = d
	}
	cc.steps = h
	return &cc
}

// take asks the client's hook whether method may be called on target.
func (c *Client) take(method, target string) error {
	if c.steps == nil {
		return nil // no string built per call
	}
	if err := c.steps.Take(step.Call, method+" "+target); err != nil {
		return fmt.Errorf("%s of CSI driver %s on %s: %w", method, c.driver, target, err)
	}
	return nil
}

// call runs one RPC with the client's timeout and classifies its error.
func call[Req, Resp any](ctx context.Context, c *Client, method string, req Req,
	rpc func(context.Context, Req, ...grpc.CallOption) (Resp, error)) (Resp, error) {
	callCtx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := rpc(callCtx, req)
	return resp, classify(ctx, c.driver, method, err)
}

// change is call for a method that changes the driver's state on target:
// the client's hook is asked first.
func change[Req, Resp any](ctx context.Context, c *Client, method, target string, req Req,
	rpc func(context.Context, Req, ...grpc.CallOption) (Resp, error)) (Resp, error) {
	if err := c.take(method, target); err != nil {
		var zero Resp
		return zero, err
	}
	return call(ctx, c, method, req, rpc)
}

// NodeGetInfo asks the driver for its ID of this node and its limits.
func (c *Client) NodeGetInfo(ctx context.Context) (NodeInfo, error) {
	resp, err := call(ctx, c, "NodeGetInfo", &csipb.NodeGetInfoRequest{}, c.node.NodeGetInfo)
	if err != nil {
		return NodeInfo{}, err
	}
	return NodeInfo{
		NodeID:            resp.GetNodeId(),
		MaxVolumesPerNode: resp.GetMaxVolumesPerNode(),
		Topology:          resp.GetAccessibleTopology().GetSegments(),
	}, nil
}

// NodeStageVolume stages a volume. Secrets in req are never logged.
func (c *Client) NodeStageVolume(ctx context.Context, req *csipb.NodeStageVolumeRequest) error {
	_, err := change(ctx, c, "NodeStageVolume", req.GetStagingTargetPath(), req, c.node.NodeStageVolume)
	return err
}

// NodeUnstageVolume unstages a volume.
func (c *Client) NodeUnstageVolume(ctx context.Context, req *csipb.NodeUnstageVolumeRequest) error {
	_, err := change(ctx, c, "NodeUnstageVolume", req.GetStagingTargetPath(), req, c.node.NodeUnstageVolume)
	return err
}

// NodePublishVolume publishes a volume. Secrets in req are never logged.
func (c *Client) NodePublishVolume(ctx context.Context, req *csipb.NodePublishVolumeRequest) error {
	_, err := change(ctx, c, "NodePublishVolume", req.GetTargetPath(), req, c.node.NodePublishVolume)
	return err
}

// NodeUnpublishVolume unpublishes a volume.
func (c *Client) NodeUnpublishVolume(ctx context.Context, req *csipb.NodeUnpublishVolumeRequest) error {
	_, err := change(ctx, c, "NodeUnpublishVolume", req.GetTargetPath(), req, c.node.NodeUnpublishVolume)
	return err
}

// NodeGetVolumeStats asks for a published volume's usage. It needs the
// GetVolumeStats capability. cond is the volume condition sent with it
// (CSI 1.3 to 1.12, read from the wire): nil when the driver lacks the
// VolumeCondition capability or sent none.
func (c *Client) NodeGetVolumeStats(ctx context.Context, req *csipb.NodeGetVolumeStatsRequest) (resp *csipb.NodeGetVolumeStatsResponse, cond *volume.Condition, err error) {
	if !c.caps.GetVolumeStats {
		return nil, nil, fmt.Errorf("CSI driver %s does not support NodeGetVolumeStats", c.driver)
	}
	resp, err = call(ctx, c, "NodeGetVolumeStats", req, c.node.NodeGetVolumeStats)
	if err == nil && c.caps.VolumeCondition {
		cond = volumeConditionOf(resp)
	}
	return resp, cond, err
}

// NodeExpandVolume expands a volume's file system on the node. It needs
// the Expand capability.
func (c *Client) NodeExpandVolume(ctx context.Context, req *csipb.NodeExpandVolumeRequest) (*csipb.NodeExpandVolumeResponse, error) {
	if !c.caps.Expand {
		return nil, fmt.Errorf("CSI driver %s does not support NodeExpandVolume", c.driver)
	}
	return change(ctx, c, "NodeExpandVolume", req.GetVolumePath(), req, c.node.NodeExpandVolume)
}
