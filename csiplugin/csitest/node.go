package csitest

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// ephemeralKey is the volume_context key with which the kubelet tells a
// driver whether a volume is an inline ephemeral one (with podInfoOnMount).
const ephemeralKey = "csi.storage.k8s.io/ephemeral"

// volume is what the server knows about one volume on this node.
type volume struct {
	staged      bool
	stagingPath string
	stageCap    *csi.VolumeCapability
	// published is keyed by target_path.
	published map[string]*publication
	capacity  int64
}

// publication is one NodePublishVolume of a volume.
type publication struct {
	stagingPath string
	capability  *csi.VolumeCapability
	readOnly    bool
}

func (p *publication) block() bool { return p.capability.GetBlock() != nil }

// nodeServer implements the CSI Node service on the server's state. Its
// checks follow the spec's "MUST" rules and the errors it lists; where the
// spec leaves the behaviour open the server takes the strict choice a
// careful driver would, so that nodevol cannot depend on leniency:
//
//   - a missing required field is InvalidArgument naming the field;
//   - repeating a stage or publish with the same arguments succeeds;
//   - repeating it with a different capability (or read-only flag, or
//     staging path for publish) is AlreadyExists;
//   - staging a staged volume at another staging path is AlreadyExists;
//   - publishing a volume that is not staged at staging_target_path (when
//     the driver stages) is FailedPrecondition;
//   - publishing with no staging_target_path on a driver that stages is
//     taken as the publish of an inline ephemeral volume, which the kubelet
//     does not stage: it is FailedPrecondition if the volume is staged, and
//     InvalidArgument if volume_context has csi.storage.k8s.io/ephemeral
//     "false";
//   - unstaging a volume that is still published is FailedPrecondition;
//   - unstaging or unpublishing what is not staged or published at that
//     path succeeds and changes nothing.
type nodeServer struct {
	csi.UnimplementedNodeServer
	s *Server
}

func missing(field string) error {
	return status.Errorf(codes.InvalidArgument, "%s is required", field)
}

// checkCapability validates a request's volume_capability.
func checkCapability(c *csi.VolumeCapability) error {
	switch {
	case c == nil:
		return missing("volume_capability")
	case c.GetAccessMode() == nil:
		return missing("volume_capability.access_mode")
	case c.GetMount() == nil && c.GetBlock() == nil:
		return missing("volume_capability.access_type")
	}
	return nil
}

// vol returns volumeID's state, creating it. The caller holds s.mu.
func (s *Server) vol(volumeID string) *volume {
	v := s.volumes[volumeID]
	if v == nil {
		v = &volume{published: make(map[string]*publication), capacity: DefaultCapacity}
		s.volumes[volumeID] = v
	}
	return v
}

// forgetIfIdle drops a volume that is neither staged nor published, so
// that the state of a long benchmark does not grow. The caller holds s.mu.
func (s *Server) forgetIfIdle(volumeID string) {
	if v := s.volumes[volumeID]; v != nil && !v.staged && len(v.published) == 0 {
		delete(s.volumes, volumeID)
	}
}

// required returns the error of the first empty value in name, value
// pairs: the request misses that field.
func required(pairs ...string) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i+1] == "" {
			return missing(pairs[i])
		}
	}
	return nil
}

// locked locks the server and returns it; the caller unlocks it.
func (n *nodeServer) locked() *Server {
	n.s.mu.Lock()
	return n.s
}

func (n *nodeServer) unimplementedUnless(ok bool, method string) error {
	if ok {
		return nil
	}
	return status.Errorf(codes.Unimplemented, "%s: driver %s does not have the capability", method, n.s.opts.DriverName)
}

// NodeStageVolume records the volume as staged at staging_target_path.
func (n *nodeServer) NodeStageVolume(_ context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	if err := n.unimplementedUnless(!n.s.opts.NoStageUnstage, "NodeStageVolume"); err != nil {
		return nil, err
	}
	if err := required("volume_id", req.GetVolumeId(), "staging_target_path", req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	if err := checkCapability(req.GetVolumeCapability()); err != nil {
		return nil, err
	}
	s := n.locked()
	defer s.mu.Unlock()
	v := s.vol(req.GetVolumeId())
	if v.staged {
		if v.stagingPath != req.GetStagingTargetPath() {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s is already staged at %s", req.GetVolumeId(), v.stagingPath)
		}
		if !proto.Equal(v.stageCap, req.GetVolumeCapability()) {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s is already staged at %s with another volume_capability", req.GetVolumeId(), v.stagingPath)
		}
		return &csi.NodeStageVolumeResponse{}, nil
	}
	v.staged = true
	v.stagingPath = req.GetStagingTargetPath()
	v.stageCap = proto.CloneOf(req.GetVolumeCapability())
	return &csi.NodeStageVolumeResponse{}, nil
}

// NodeUnstageVolume forgets the staging of a volume that no target path
// uses any more.
func (n *nodeServer) NodeUnstageVolume(_ context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	if err := n.unimplementedUnless(!n.s.opts.NoStageUnstage, "NodeUnstageVolume"); err != nil {
		return nil, err
	}
	if err := required("volume_id", req.GetVolumeId(), "staging_target_path", req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	s := n.locked()
	defer s.mu.Unlock()
	v := s.volumes[req.GetVolumeId()]
	if v == nil || !v.staged || v.stagingPath != req.GetStagingTargetPath() {
		return &csi.NodeUnstageVolumeResponse{}, nil
	}
	if len(v.published) > 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is still published at %d target paths", req.GetVolumeId(), len(v.published))
	}
	v.staged, v.stagingPath, v.stageCap = false, "", nil
	s.forgetIfIdle(req.GetVolumeId())
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// NodePublishVolume records the volume as published at target_path.
func (n *nodeServer) NodePublishVolume(_ context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	// The kubelet publishes inline (CSI ephemeral) volumes without staging
	// them, even on drivers that stage, and drivers that offer the
	// Ephemeral lifecycle mode accept that. So an empty
	// staging_target_path is taken as such a publish, unless the volume
	// context says the volume is not ephemeral.
	stages := !n.s.opts.NoStageUnstage
	inline := stages && req.GetStagingTargetPath() == "" && req.GetVolumeContext()[ephemeralKey] != "false"
	switch {
	case req.GetVolumeId() == "":
		return nil, missing("volume_id")
	case req.GetTargetPath() == "":
		return nil, missing("target_path")
	case stages && !inline && req.GetStagingTargetPath() == "":
		return nil, missing("staging_target_path")
	}
	if err := checkCapability(req.GetVolumeCapability()); err != nil {
		return nil, err
	}
	s := n.locked()
	defer s.mu.Unlock()
	pub := &publication{
		capability: proto.CloneOf(req.GetVolumeCapability()),
		readOnly:   req.GetReadonly(),
	}
	if stages {
		pub.stagingPath = req.GetStagingTargetPath()
	}
	v := s.volumes[req.GetVolumeId()]
	switch {
	case inline && v != nil && v.staged:
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is staged at %s but published without staging_target_path", req.GetVolumeId(), v.stagingPath)
	case stages && !inline && (v == nil || !v.staged || v.stagingPath != pub.stagingPath):
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not staged at %s", req.GetVolumeId(), pub.stagingPath)
	}
	v = s.vol(req.GetVolumeId())
	if old := v.published[req.GetTargetPath()]; old != nil {
		if old.stagingPath != pub.stagingPath || old.readOnly != pub.readOnly || !proto.Equal(old.capability, pub.capability) {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s is already published at %s with other arguments", req.GetVolumeId(), req.GetTargetPath())
		}
		return &csi.NodePublishVolumeResponse{}, nil
	}
	if s.opts.CreateTargetDirs {
		if err := createTarget(req.GetTargetPath(), pub.block()); err != nil {
			s.forgetIfIdle(req.GetVolumeId())
			return nil, status.Errorf(codes.Internal, "creating target path: %v", err)
		}
	}
	v.published[req.GetTargetPath()] = pub
	return &csi.NodePublishVolumeResponse{}, nil
}

// createTarget creates a publish target the way a driver does: a directory
// for a mount volume, an empty file for a block volume (which a real
// driver bind-mounts the device onto). Existing paths are kept.
func createTarget(path string, block bool) error {
	if !block {
		return os.MkdirAll(path, 0o750)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY, 0o640)
	if err != nil {
		return err
	}
	return f.Close()
}

// NodeUnpublishVolume forgets a publication.
func (n *nodeServer) NodeUnpublishVolume(_ context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	if err := required("volume_id", req.GetVolumeId(), "target_path", req.GetTargetPath()); err != nil {
		return nil, err
	}
	s := n.locked()
	defer s.mu.Unlock()
	v := s.volumes[req.GetVolumeId()]
	if v == nil || v.published[req.GetTargetPath()] == nil {
		return &csi.NodeUnpublishVolumeResponse{}, nil
	}
	if s.opts.CreateTargetDirs {
		// A driver unmounts and removes the target. Nothing is mounted
		// here, so whatever a workload wrote lives in the target itself:
		// it is the simulated volume's content and goes with it.
		if err := os.RemoveAll(req.GetTargetPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, status.Errorf(codes.Internal, "removing target path: %v", err)
		}
	}
	delete(v.published, req.GetTargetPath())
	s.forgetIfIdle(req.GetVolumeId())
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// usedAt finds a publication or staging of volumeID at path. The caller
// holds s.mu.
func (s *Server) usedAt(volumeID, path string) (v *volume, block bool, err error) {
	v = s.volumes[volumeID]
	if v != nil {
		if p := v.published[path]; p != nil {
			return v, p.block(), nil
		}
		if v.staged && v.stagingPath == path {
			return v, v.stageCap.GetBlock() != nil, nil
		}
	}
	return nil, false, status.Errorf(codes.NotFound, "volume %s is neither published nor staged at %s", volumeID, path)
}

// NodeGetVolumeStats reports a plausible usage for a published or staged
// volume: a quarter of its capacity and a few inodes used.
func (n *nodeServer) NodeGetVolumeStats(_ context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	if err := n.unimplementedUnless(n.s.opts.GetVolumeStats, "NodeGetVolumeStats"); err != nil {
		return nil, err
	}
	if err := required("volume_id", req.GetVolumeId(), "volume_path", req.GetVolumePath()); err != nil {
		return nil, err
	}
	s := n.locked()
	defer s.mu.Unlock()
	v, block, err := s.usedAt(req.GetVolumeId(), req.GetVolumePath())
	if err != nil {
		return nil, err
	}
	if block {
		// A block volume has no file system: only its size is known.
		return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
			{Unit: csi.VolumeUsage_BYTES, Total: v.capacity},
		}}, nil
	}
	used := v.capacity / 4
	resp := &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: v.capacity, Used: used, Available: v.capacity - used},
		{Unit: csi.VolumeUsage_INODES, Total: 65536, Used: 11, Available: 65536 - 11},
	}}
	if s.opts.VolumeCondition {
		appendVolumeCondition(resp, s.conditions[req.GetVolumeId()])
	}
	return resp, nil
}

// NodeExpandVolume grows a published or staged volume to the required
// size; it never shrinks one.
func (n *nodeServer) NodeExpandVolume(_ context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	if err := n.unimplementedUnless(n.s.opts.Expand, "NodeExpandVolume"); err != nil {
		return nil, err
	}
	if err := required("volume_id", req.GetVolumeId(), "volume_path", req.GetVolumePath()); err != nil {
		return nil, err
	}
	if c := req.GetVolumeCapability(); c != nil {
		if err := checkCapability(c); err != nil {
			return nil, err
		}
	}
	s := n.locked()
	defer s.mu.Unlock()
	v, _, err := s.usedAt(req.GetVolumeId(), req.GetVolumePath())
	if err != nil {
		return nil, err
	}
	r := req.GetCapacityRange()
	if lim := r.GetLimitBytes(); lim > 0 && r.GetRequiredBytes() > lim {
		return nil, status.Errorf(codes.OutOfRange, "required_bytes %d exceeds limit_bytes %d", r.GetRequiredBytes(), lim)
	}
	v.capacity = max(v.capacity, r.GetRequiredBytes())
	return &csi.NodeExpandVolumeResponse{CapacityBytes: v.capacity}, nil
}

// NodeGetCapabilities reports the capabilities Options selected.
func (n *nodeServer) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	o := n.s.opts
	var resp csi.NodeGetCapabilitiesResponse
	add := func(on bool, t csi.NodeServiceCapability_RPC_Type) {
		if on {
			resp.Capabilities = append(resp.Capabilities, &csi.NodeServiceCapability{
				Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: t}},
			})
		}
	}
	add(!o.NoStageUnstage, csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME)
	add(o.GetVolumeStats, csi.NodeServiceCapability_RPC_GET_VOLUME_STATS)
	add(o.Expand, csi.NodeServiceCapability_RPC_EXPAND_VOLUME)
	add(o.SingleNodeMultiWriter, csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER)
	add(o.VolumeMountGroup, csi.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP)
	add(o.VolumeCondition, volumeConditionCapability)
	add(o.VolumeHealth, csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH)
	add(o.StorageHealth, csi.NodeServiceCapability_RPC_GET_STORAGE_HEALTH)
	return &resp, nil
}

// NodeGetInfo reports the node ID and topology from Options, and the
// volume limit (Options.MaxVolumes, or the last SetMaxVolumes).
func (n *nodeServer) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	o := n.s.opts
	resp := &csi.NodeGetInfoResponse{NodeId: o.NodeID, MaxVolumesPerNode: n.s.maxVolumes.Load()}
	if len(o.Topology) > 0 {
		resp.AccessibleTopology = &csi.Topology{Segments: maps.Clone(o.Topology)}
	}
	return resp, nil
}
