package driver

import (
	"context"
	"errors"
	"io/fs"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"k8s.io/klog/v2"
)

func wrapInt64(n int64) *wrapperspb.Int64Value { return wrapperspb.Int64(n) }

// tokenPrefix marks list tokens. A token is "v1:" and the ID the next
// page starts at, so that volumes deleted between pages do not shift the
// pages (no volume is listed twice).
const tokenPrefix = "v1:"

// page returns the volumes of one page of a listing and the token of the
// next, or an Aborted error for a token this driver did not make.
func page(vols []*volumeState, maxEntries int32, token string) ([]*volumeState, string, error) {
	ids := make([]string, len(vols))
	for i, v := range vols {
		ids[i] = v.ID
	}
	start, end, next, err := pageIDs(ids, maxEntries, token)
	if err != nil {
		return nil, "", err
	}
	return vols[start:end], next, nil
}

// pageIDs returns the bounds in sorted ids of one page of a listing and
// the token of the next, or an Aborted error for a token this driver did
// not make.
func pageIDs(ids []string, maxEntries int32, token string) (start, end int, next string, err error) {
	if maxEntries < 0 {
		return 0, 0, "", invalid("max_entries %d is negative", maxEntries)
	}
	if token != "" {
		from, ok := strings.CutPrefix(token, tokenPrefix)
		if !ok || validateID(from) != nil {
			return 0, 0, "", status.Errorf(codes.Aborted, "starting_token %q was not made by this driver", token)
		}
		start, _ = slices.BinarySearch(ids, from)
	}
	end = len(ids)
	if maxEntries > 0 && start+int(maxEntries) < len(ids) {
		end = start + int(maxEntries)
		next = tokenPrefix + ids[end]
	}
	return start, end, next, nil
}

func (d *server) publishedNodes(v *volumeState) []string {
	return slices.Sorted(maps.Keys(v.Nodes))
}

// ListVolumes lists the volumes by ID, max_entries at a time.
func (d *server) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	vols, next, err := page(d.store.list(), req.GetMaxEntries(), req.GetStartingToken())
	if err != nil {
		return nil, err
	}
	resp := &csi.ListVolumesResponse{NextToken: next}
	for _, v := range vols {
		resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{
			Volume: d.csiVolume(v),
			Status: &csi.ListVolumesResponse_VolumeStatus{PublishedNodeIds: d.publishedNodes(v)},
		})
	}
	return resp, nil
}

// ControllerGetVolume returns one volume and the nodes it is published to.
func (d *server) ControllerGetVolume(ctx context.Context, req *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error) {
	id := req.GetVolumeId()
	if err := validateID(id); err != nil {
		return nil, err
	}
	v := d.store.get(id)
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %s does not exist", id)
	}
	return &csi.ControllerGetVolumeResponse{
		Volume: d.csiVolume(v),
		Status: &csi.ControllerGetVolumeResponse_VolumeStatus{PublishedNodeIds: d.publishedNodes(v)},
	}, nil
}

// ControllerExpandVolume grows the image to the required size. The
// staged loop device and file system follow in NodeExpandVolume, so
// node expansion is always required. Images never shrink: a smaller
// request returns the current size.
func (d *server) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	id := req.GetVolumeId()
	if err := validateID(id); err != nil {
		return nil, err
	}
	if req.GetCapacityRange() == nil {
		return nil, invalid("capacity_range is required")
	}
	if req.GetVolumeCapability() != nil {
		if _, err := checkCapability("volume_capability", req.GetVolumeCapability()); err != nil {
			return nil, err
		}
	}
	size, err := pickSize(req.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	unlock, err := d.lockVolume(ctx, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	v := d.store.get(id)
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %s does not exist", id)
	}
	if lim := req.GetCapacityRange().GetLimitBytes(); lim > 0 && v.CapacityBytes > lim {
		return nil, status.Errorf(codes.OutOfRange, "volume %s has %d bytes, more than limit_bytes %d: volumes cannot shrink", id, v.CapacityBytes, lim)
	}
	if size > v.CapacityBytes {
		if free, err := d.freeBytes(); err != nil {
			return nil, status.Errorf(codes.Internal, "volume %s: %v", id, err)
		} else if size-v.CapacityBytes > free {
			return nil, status.Errorf(codes.ResourceExhausted, "volume %s: %d more bytes requested, %d free", id, size-v.CapacityBytes, free)
		}
		if err := os.Truncate(d.store.imagePath(id), size); err != nil {
			return nil, status.Errorf(codes.Internal, "volume %s: growing image: %v", id, err)
		}
		if err := d.mid(ctx, "ControllerExpandVolume", id); err != nil {
			return nil, err
		}
		v.CapacityBytes = size
		if err := d.store.put(v); err != nil {
			return nil, status.Errorf(codes.Internal, "%v", err)
		}
		klog.FromContext(ctx).V(2).Info("Expanded volume image", "volumeID", id, "bytes", size)
	}
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: v.CapacityBytes, NodeExpansionRequired: true}, nil
}

// volumeHealth checks the image behind a volume: missing is
// INACCESSIBLE, smaller than the recorded capacity is DATA_LOSS.
func (d *server) volumeHealth(v *volumeState) *csi.VolumeHealth {
	h := &csi.VolumeHealth{VolumeId: v.ID}
	fi, err := os.Stat(d.store.imagePath(v.ID))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		h.HealthStatuses = append(h.HealthStatuses, &csi.VolumeHealth_VolumeHealthEntry{
			Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: "ImageMissing", Message: "the volume's image file is gone",
		})
	case err != nil:
		h.HealthStatuses = append(h.HealthStatuses, &csi.VolumeHealth_VolumeHealthEntry{
			Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: "ImageUnreadable", Message: err.Error(),
		})
	case fi.Size() < v.CapacityBytes:
		h.HealthStatuses = append(h.HealthStatuses, &csi.VolumeHealth_VolumeHealthEntry{
			Status: csi.VolumeHealthErrorType_DATA_LOSS, Reason: "ImageTruncated", Message: "the volume's image file is smaller than the volume",
		})
	}
	return h
}

// ControllerGetVolumeHealth reports the health of one volume's image.
func (d *server) ControllerGetVolumeHealth(ctx context.Context, req *csi.ControllerGetVolumeHealthRequest) (*csi.ControllerGetVolumeHealthResponse, error) {
	id := req.GetVolumeId()
	if err := validateID(id); err != nil {
		return nil, err
	}
	v := d.store.get(id)
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %s does not exist", id)
	}
	return &csi.ControllerGetVolumeHealthResponse{VolumeHealth: d.volumeHealth(v)}, nil
}

// ControllerListVolumeHealth lists the volumes whose images are not
// healthy, max_entries at a time.
func (d *server) ControllerListVolumeHealth(ctx context.Context, req *csi.ControllerListVolumeHealthRequest) (*csi.ControllerListVolumeHealthResponse, error) {
	var sick []*volumeState
	health := map[string]*csi.VolumeHealth{}
	for _, v := range d.store.list() {
		if h := d.volumeHealth(v); len(h.HealthStatuses) > 0 {
			sick = append(sick, v)
			health[v.ID] = h
		}
	}
	vols, next, err := page(sick, req.GetMaxEntries(), req.GetStartingToken())
	if err != nil {
		return nil, err
	}
	resp := &csi.ControllerListVolumeHealthResponse{NextToken: next}
	for _, v := range vols {
		resp.Entries = append(resp.Entries, health[v.ID])
	}
	return resp, nil
}

// ControllerGetCapabilities lists what the controller service does.
func (d *server) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	var caps []*csi.ControllerServiceCapability
	for _, t := range []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csi.ControllerServiceCapability_RPC_GET_CAPACITY,
		csi.ControllerServiceCapability_RPC_PUBLISH_READONLY,
		csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES_PUBLISHED_NODES,
		csi.ControllerServiceCapability_RPC_GET_VOLUME,
		csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
		csi.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH,
		csi.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH,
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
		csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
		csi.ControllerServiceCapability_RPC_GET_SNAPSHOT,
		csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
		csi.ControllerServiceCapability_RPC_MODIFY_VOLUME,
	} {
		caps = append(caps, &csi.ControllerServiceCapability{
			Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: t}},
		})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}
