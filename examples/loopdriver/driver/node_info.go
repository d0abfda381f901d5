package driver

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"maps"
	"os"
	"syscall"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"
)

// volumePath finds path among the staging and target paths of v and
// says whether it is a block device there. Any other path is NotFound:
// the driver reports only on paths it mounted.
func volumePath(v *volumeState, path string) (block bool, err error) {
	if s := v.Stage; s != nil && s.Path == path {
		return s.Block, nil
	}
	if t, ok := v.Targets[path]; ok {
		return t.Block, nil
	}
	return false, status.Errorf(codes.NotFound, "volume %s is not staged or published at %q", v.ID, path)
}

// NodeGetVolumeStats reports bytes and inodes of a staged or published
// file system (from statfs), or the size of a block volume.
func (d *server) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	id, path := req.GetVolumeId(), req.GetVolumePath()
	if err := validateID(id); err != nil {
		return nil, err
	}
	if path == "" {
		return nil, invalid("volume_path is required")
	}
	v, err := d.knownVolume(id)
	if err != nil {
		return nil, err
	}
	block, err := volumePath(v, path)
	if err != nil {
		return nil, err
	}
	if block {
		size, err := deviceSize(path)
		if err != nil {
			return nil, statError(id, err)
		}
		return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{{Unit: csi.VolumeUsage_BYTES, Total: size}}}, nil
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return nil, statError(id, err)
	}
	bs := int64(st.Bsize)
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: int64(st.Blocks) * bs, Available: int64(st.Bavail) * bs, Used: int64(st.Blocks-st.Bfree) * bs},
		{Unit: csi.VolumeUsage_INODES, Total: int64(st.Files), Available: int64(st.Ffree), Used: int64(st.Files - st.Ffree)},
	}}, nil
}

func statError(id string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return status.Errorf(codes.NotFound, "volume %s: %v", id, err)
	}
	return status.Errorf(codes.Internal, "volume %s: %v", id, err)
}

// deviceSize returns the size of the block device at path.
func deviceSize(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return f.Seek(0, io.SeekEnd)
}

// NodeExpandVolume makes the loop device pick up the grown image and,
// for a file system, grows it online (resize2fs, xfs_growfs). The image
// itself is grown by ControllerExpandVolume.
func (d *server) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	id, path := req.GetVolumeId(), req.GetVolumePath()
	if err := validateID(id); err != nil {
		return nil, err
	}
	if path == "" {
		return nil, invalid("volume_path is required")
	}
	unlock, err := d.lockVolume(ctx, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	v, err := d.knownVolume(id)
	if err != nil {
		return nil, err
	}
	if _, err := volumePath(v, path); err != nil {
		return nil, err
	}
	if req.GetVolumeCapability() != nil {
		if _, err := checkCapability("volume_capability", req.GetVolumeCapability()); err != nil {
			return nil, err
		}
	}
	if r := req.GetCapacityRange().GetRequiredBytes(); r > v.CapacityBytes {
		return nil, status.Errorf(codes.OutOfRange, "volume %s: required_bytes %d is more than the volume's %d: call ControllerExpandVolume first", id, r, v.CapacityBytes)
	}
	devs, err := d.loop.Find(ctx, d.store.imagePath(id))
	if err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: %v", id, err)
	}
	if len(devs) == 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not attached to a loop device: stage it first", id)
	}
	for _, dev := range devs {
		if err := d.loop.Refresh(ctx, dev); err != nil {
			return nil, status.Errorf(codes.Internal, "volume %s: %v", id, err)
		}
	}
	if err := d.mid(ctx, "NodeExpandVolume", id); err != nil {
		return nil, err
	}
	if v.Stage != nil && !v.Stage.Block {
		if _, err := mount.NewResizeFs(d.exec).Resize(devs[0], v.Stage.Path); err != nil {
			return nil, status.Errorf(codes.Internal, "volume %s: growing file system on %s: %v", id, devs[0], err)
		}
	}
	klog.FromContext(ctx).V(2).Info("Expanded volume on node", "path", path, "bytes", v.CapacityBytes)
	return &csi.NodeExpandVolumeResponse{CapacityBytes: v.CapacityBytes}, nil
}

// NodeGetInfo returns the node ID, the volume limit and the node's
// topology segment.
func (d *server) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{
		NodeId:             d.nodeID,
		MaxVolumesPerNode:  d.maxVolumes,
		AccessibleTopology: &csi.Topology{Segments: maps.Clone(d.topology)},
	}, nil
}

// NodeGetCapabilities lists what the node service does.
func (d *server) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	var caps []*csi.NodeServiceCapability
	for _, t := range []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
		csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
		csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH,
		csi.NodeServiceCapability_RPC_GET_STORAGE_HEALTH,
	} {
		caps = append(caps, &csi.NodeServiceCapability{
			Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: t}},
		})
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

// NodeGetVolumeHealth reports the image's health and, if the volume is
// staged, whether its loop device and mounts are still there.
func (d *server) NodeGetVolumeHealth(ctx context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	id := req.GetVolumeId()
	if err := validateID(id); err != nil {
		return nil, err
	}
	v, err := d.knownVolume(id)
	if err != nil {
		return nil, err
	}
	h := d.volumeHealth(v)
	bad := func(reason, msg string) {
		h.HealthStatuses = append(h.HealthStatuses, &csi.VolumeHealth_VolumeHealthEntry{
			Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: reason, Message: msg,
		})
	}
	if v.Stage == nil && len(v.Targets) == 0 {
		return &csi.NodeGetVolumeHealthResponse{VolumeHealth: h}, nil
	}
	devs, err := d.loop.Find(ctx, d.store.imagePath(id))
	switch {
	case err != nil:
		bad("LoopDeviceUnknown", err.Error())
	case len(devs) == 0:
		bad("LoopDeviceDetached", "the volume is staged or published but its image is not attached to a loop device")
	default:
		check := map[string]bool{}
		if v.Stage != nil && !v.Stage.Block {
			check[v.Stage.Path] = false
		}
		for t, s := range v.Targets {
			check[t] = s.Block
		}
		for path, block := range check {
			if ok, err := mountedFrom(path, devs[0], block); err != nil || !ok {
				bad("NotMounted", "the volume is no longer mounted at "+path)
			}
		}
	}
	return &csi.NodeGetVolumeHealthResponse{VolumeHealth: h}, nil
}

// NodeGetStorageHealth reports trouble with the state directory, where
// every image lives: unreachable, or too full for another volume.
func (d *server) NodeGetStorageHealth(context.Context, *csi.NodeGetStorageHealthRequest) (*csi.NodeGetStorageHealthResponse, error) {
	resp := &csi.NodeGetStorageHealthResponse{}
	free, err := d.freeBytes()
	switch {
	case err != nil:
		resp.BackendHealth = append(resp.BackendHealth, &csi.NodeGetStorageHealthResponse_StorageBackendHealth{
			Status: csi.StorageHealthErrorType_STORAGE_UNREACHABLE, Reason: "StateDirUnreachable", Message: err.Error(),
		})
	case free < minVolumeSize:
		resp.BackendHealth = append(resp.BackendHealth, &csi.NodeGetStorageHealthResponse_StorageBackendHealth{
			Status: csi.StorageHealthErrorType_STORAGE_DEGRADED, Reason: "StateDirFull", Message: "less free space than the smallest volume",
		})
	}
	return resp, nil
}
