package csitest

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// SetVolumeHealth sets the adverse conditions NodeGetVolumeHealth reports
// for volumeID from now on (with Options.VolumeHealth); none: healthy. A
// volume given health is known to the driver even if it was never staged
// or published (one whose stage failed for that condition).
func (s *Server) SetVolumeHealth(volumeID string, entries ...*csi.VolumeHealth_VolumeHealthEntry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.volumeHealth == nil {
		s.volumeHealth = map[string][]*csi.VolumeHealth_VolumeHealthEntry{}
	}
	s.volumeHealth[volumeID] = cloneAll(entries)
}

// SetStorageHealth sets the adverse conditions NodeGetStorageHealth
// reports from now on (with Options.StorageHealth); none: healthy.
func (s *Server) SetStorageHealth(entries ...*csi.NodeGetStorageHealthResponse_StorageBackendHealth) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.storageHealth = cloneAll(entries)
}

func cloneAll[M proto.Message](in []M) []M {
	out := make([]M, len(in))
	for i, m := range in {
		out[i] = proto.Clone(m).(M)
	}
	return out
}

// NodeGetVolumeHealth reports what SetVolumeHealth set for the volume, no
// condition for a volume that is staged or published without one, and
// NotFound, as the spec says, for a volume the driver knows nothing of.
// A staging_target_path or volume_publish_path given must be absolute.
func (n *nodeServer) NodeGetVolumeHealth(_ context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	if err := n.unimplementedUnless(n.s.opts.VolumeHealth, "NodeGetVolumeHealth"); err != nil {
		return nil, err
	}
	if err := required("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	for field, p := range map[string]string{"staging_target_path": req.GetStagingTargetPath(), "volume_publish_path": req.GetVolumePublishPath()} {
		if p != "" && p[0] != '/' {
			return nil, status.Errorf(codes.InvalidArgument, "%s %q is not absolute", field, p)
		}
	}
	s := n.locked()
	defer s.mu.Unlock()
	id := req.GetVolumeId()
	entries, set := s.volumeHealth[id]
	if !set && s.volumes[id] == nil {
		return nil, status.Errorf(codes.NotFound, "volume %s does not exist on this node", id)
	}
	return &csi.NodeGetVolumeHealthResponse{VolumeHealth: &csi.VolumeHealth{VolumeId: id, HealthStatuses: cloneAll(entries)}}, nil
}

// NodeGetStorageHealth reports what SetStorageHealth set.
func (n *nodeServer) NodeGetStorageHealth(context.Context, *csi.NodeGetStorageHealthRequest) (*csi.NodeGetStorageHealthResponse, error) {
	if err := n.unimplementedUnless(n.s.opts.StorageHealth, "NodeGetStorageHealth"); err != nil {
		return nil, err
	}
	s := n.locked()
	defer s.mu.Unlock()
	return &csi.NodeGetStorageHealthResponse{BackendHealth: cloneAll(s.storageHealth)}, nil
}
