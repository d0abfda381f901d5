package driver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"syscall"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
)

const (
	// minVolumeSize is the smallest volume: ext4 with a journal needs a
	// few MiB, and a smaller loop device is of no use.
	minVolumeSize = 16 << 20
	// defaultVolumeSize is used when CreateVolume gives no required size.
	defaultVolumeSize = 64 << 20
	// sizeAlign keeps images a whole number of file-system blocks (and
	// so of 512-byte sectors, as loop devices need).
	sizeAlign = 4096
)

// volumeIDFor derives the volume ID from the CreateVolume name, so that
// a retried CreateVolume finds the volume even if the driver crashed
// before answering.
func volumeIDFor(name string) string {
	sum := sha256.Sum256([]byte(name))
	return "loop-" + hex.EncodeToString(sum[:10])
}

// pickSize chooses the image size for a capacity range.
func pickSize(r *csi.CapacityRange) (int64, error) {
	req, lim := r.GetRequiredBytes(), r.GetLimitBytes()
	if req < 0 || lim < 0 {
		return 0, status.Errorf(codes.OutOfRange, "capacity_range: negative bytes (required %d, limit %d)", req, lim)
	}
	if lim > 0 && req > lim {
		return 0, status.Errorf(codes.OutOfRange, "capacity_range: required_bytes %d exceeds limit_bytes %d", req, lim)
	}
	size := max(req, int64(minVolumeSize))
	if req == 0 {
		size = defaultVolumeSize
		if lim > 0 && lim < size {
			size = lim / sizeAlign * sizeAlign
		}
	}
	size = (size + sizeAlign - 1) / sizeAlign * sizeAlign
	if size < minVolumeSize || (lim > 0 && size > lim) {
		return 0, status.Errorf(codes.OutOfRange, "capacity_range (required %d, limit %d): volumes are at least %d bytes, in multiples of %d", req, lim, minVolumeSize, sizeAlign)
	}
	return size, nil
}

// sizeFits reports whether an existing volume of size satisfies r.
func sizeFits(size int64, r *csi.CapacityRange) bool {
	return size >= r.GetRequiredBytes() && (r.GetLimitBytes() == 0 || size <= r.GetLimitBytes())
}

// freeBytes is the space left for images in the state directory.
func (d *server) freeBytes() (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(d.store.dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", d.store.dir, err)
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// topologyOK reports whether this node is allowed by the requisite
// topologies of req (no requisite allows every node).
func (d *server) topologyOK(req *csi.TopologyRequirement) bool {
	requisite := req.GetRequisite()
	if len(requisite) == 0 {
		return true
	}
	for _, t := range requisite {
		if maps.Equal(t.GetSegments(), d.topology) {
			return true
		}
	}
	return false
}

func (d *server) csiVolume(v *volumeState) *csi.Volume {
	vol := &csi.Volume{
		VolumeId:           v.ID,
		CapacityBytes:      v.CapacityBytes,
		AccessibleTopology: []*csi.Topology{{Segments: maps.Clone(d.topology)}},
	}
	switch kind, id, _ := strings.Cut(v.Source, ":"); kind {
	case "snapshot":
		vol.ContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: id}}}
	case "volume":
		vol.ContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id}}}
	}
	return vol
}

// source is a new volume's content source: the image to copy.
type source struct {
	kind, id, image string
	size            int64
}

// String is how volumeState.Source records s ("" for none).
func (s *source) String() string {
	if s == nil {
		return ""
	}
	return s.kind + ":" + s.id
}

// contentSource resolves CreateVolume's volume_content_source: a snapshot
// or a volume that must exist (NotFound otherwise).
func (d *server) contentSource(cs *csi.VolumeContentSource) (*source, error) {
	switch {
	case cs == nil:
		return nil, nil
	case cs.GetSnapshot() != nil:
		id := cs.GetSnapshot().GetSnapshotId()
		if err := validateSnapshotID("volume_content_source.snapshot.snapshot_id", id); err != nil {
			return nil, err
		}
		sn := d.snaps.get(id)
		if sn == nil {
			return nil, status.Errorf(codes.NotFound, "volume_content_source: snapshot %s not found", id)
		}
		return &source{kind: "snapshot", id: id, image: d.snaps.imagePath(id), size: sn.SizeBytes}, nil
	case cs.GetVolume() != nil:
		id := cs.GetVolume().GetVolumeId()
		if id == "" {
			return nil, invalid("volume_content_source.volume.volume_id is required")
		}
		if err := validateID(id); err != nil {
			return nil, err
		}
		v := d.store.get(id)
		if v == nil {
			return nil, status.Errorf(codes.NotFound, "volume_content_source: volume %s not found", id)
		}
		return &source{kind: "volume", id: id, image: d.store.imagePath(id), size: v.CapacityBytes}, nil
	}
	return nil, invalid("volume_content_source: neither a snapshot nor a volume")
}

// CreateVolume creates a sparse image file of the requested size. A
// second call with the same name returns the same volume if its size
// fits the capacity range, AlreadyExists otherwise.
func (d *server) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if err := validateName(req.GetName()); err != nil {
		return nil, err
	}
	if err := checkCapabilities("volume_capabilities", req.GetVolumeCapabilities()); err != nil {
		return nil, err
	}
	if err := checkParameters(req.GetParameters()); err != nil {
		return nil, err
	}
	if err := checkMutableParameters("mutable_parameters", req.GetMutableParameters()); err != nil {
		return nil, err
	}
	size, err := pickSize(req.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	src, err := d.contentSource(req.GetVolumeContentSource())
	if err != nil {
		return nil, err
	}
	if src != nil && size < src.size {
		// A volume made from a source holds all of it.
		if lim := req.GetCapacityRange().GetLimitBytes(); lim > 0 && lim < src.size {
			return nil, status.Errorf(codes.OutOfRange, "capacity_range: limit_bytes %d is smaller than the source's %d bytes", lim, src.size)
		}
		size = src.size
	}
	id := volumeIDFor(req.GetName())
	unlock, err := d.lockVolume(ctx, id)
	if err != nil {
		return nil, err
	}
	defer unlock()

	if v := d.store.get(id); v != nil {
		if v.Name != req.GetName() {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s: ID already used by volume name %q", id, v.Name)
		}
		if v.Source != src.String() {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s (name %q) exists with content source %q, not %q", id, v.Name, v.Source, src.String())
		}
		if !sizeFits(v.CapacityBytes, req.GetCapacityRange()) {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s (name %q) exists with %d bytes, outside the requested capacity range", id, v.Name, v.CapacityBytes)
		}
		return &csi.CreateVolumeResponse{Volume: d.csiVolume(v)}, nil
	}
	if !d.topologyOK(req.GetAccessibilityRequirements()) {
		return nil, status.Errorf(codes.ResourceExhausted, "volume %s: requisite topology does not include node %s", id, d.nodeID)
	}
	if free, err := d.freeBytes(); err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: %v", id, err)
	} else if size > free {
		return nil, status.Errorf(codes.ResourceExhausted, "volume %s: %d bytes requested, %d free in the state directory", id, size, free)
	}
	if src != nil {
		err = copySparse(d.store.imagePath(id), src.image, size)
	} else {
		err = d.writeImage(id, size)
	}
	if err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: %v", id, err)
	}
	if err := d.mid(ctx, "CreateVolume", id); err != nil {
		_ = os.Remove(d.store.imagePath(id))
		return nil, err
	}
	v := &volumeState{ID: id, Name: req.GetName(), CapacityBytes: size, Source: src.String(), MutableParameters: req.GetMutableParameters()}
	if err := d.store.put(v); err != nil {
		_ = os.Remove(d.store.imagePath(id))
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	klog.FromContext(ctx).V(2).Info("Created volume", "volumeID", id, "name", v.Name, "bytes", size)
	return &csi.CreateVolumeResponse{Volume: d.csiVolume(v)}, nil
}

// writeImage makes a sparse image of size bytes. It writes a temporary
// file and renames it, so that the image never exists half-made.
func (d *server) writeImage(id string, size int64) error {
	f, err := os.CreateTemp(d.store.dir, "."+id+".img.tmp-*")
	if err != nil {
		return fmt.Errorf("creating image: %w", err)
	}
	tmp := f.Name()
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, d.store.imagePath(id))
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("creating image: %w", err)
	}
	return nil
}

// DeleteVolume deletes the image and state of a volume. An unknown
// volume is already deleted. A volume still published to a node, staged
// or attached to a loop device is refused with FailedPrecondition; a loop
// device that is only being detached is waited for (Unavailable if it
// takes too long).
func (d *server) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	id := req.GetVolumeId()
	if err := validateID(id); err != nil {
		return nil, err
	}
	unlock, err := d.lockVolume(ctx, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	v := d.store.get(id)
	if v == nil {
		return &csi.DeleteVolumeResponse{}, nil
	}
	switch {
	case len(v.Nodes) > 0:
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is still published to nodes %v", id, slices.Sorted(maps.Keys(v.Nodes)))
	case v.Stage != nil || len(v.Targets) > 0:
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is still staged or published on node %s", id, d.nodeID)
	}
	image := d.store.imagePath(id)
	devs, err := d.loop.Find(ctx, image)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: %v", id, err)
	}
	// A device being detached is as good as gone: wait for it.
	if devs, err = d.skipDetaching(ctx, id, image, devs); err != nil {
		return nil, err
	}
	if len(devs) > 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is still attached to %v: NodeUnstageVolume it first", id, devs)
	}
	if err := d.store.remove(id); err != nil {
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	klog.FromContext(ctx).V(2).Info("Deleted volume", "volumeID", id)
	return &csi.DeleteVolumeResponse{}, nil
}

// ControllerPublishVolume records that the volume is published to the
// node. The only node is this driver's own; others are NotFound.
func (d *server) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	id := req.GetVolumeId()
	if err := validateID(id); err != nil {
		return nil, err
	}
	if req.GetNodeId() == "" {
		return nil, invalid("node_id is required")
	}
	if _, err := checkCapability("volume_capability", req.GetVolumeCapability()); err != nil {
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
	if req.GetNodeId() != d.nodeID {
		return nil, status.Errorf(codes.NotFound, "volume %s: node %q does not exist (this driver serves node %q)", id, req.GetNodeId(), d.nodeID)
	}
	pub := nodePublication{ReadOnly: req.GetReadonly()}
	if old, ok := v.Nodes[d.nodeID]; ok {
		if old != pub {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s is already published to node %s with readonly=%v", id, d.nodeID, old.ReadOnly)
		}
		return &csi.ControllerPublishVolumeResponse{PublishContext: d.publishContext(v, pub)}, nil
	}
	if n := d.publishedCount(); n >= d.maxVolumes {
		return nil, status.Errorf(codes.ResourceExhausted, "volume %s: node %s already has %d volumes published, its maximum", id, d.nodeID, n)
	}
	if v.Nodes == nil {
		v.Nodes = map[string]nodePublication{}
	}
	v.Nodes[d.nodeID] = pub
	if err := d.store.put(v); err != nil {
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	return &csi.ControllerPublishVolumeResponse{PublishContext: d.publishContext(v, pub)}, nil
}

// publishContext tells the node which image backs the volume. The node
// side of this driver does not trust it (it looks the volume up by ID in
// its own state); it is there for operators and for split deployments.
func (d *server) publishContext(v *volumeState, p nodePublication) map[string]string {
	return map[string]string{
		"image":    d.store.imagePath(v.ID),
		"readOnly": fmt.Sprint(p.ReadOnly),
	}
}

// publishedCount is the number of volumes published to this node.
func (d *server) publishedCount() int64 {
	var n int64
	for _, v := range d.store.list() {
		if _, ok := v.Nodes[d.nodeID]; ok {
			n++
		}
	}
	return n
}

// ControllerUnpublishVolume forgets the publication of the volume to the
// node (to every node when node_id is empty). Not being published, an
// unknown node and an unknown volume are success.
func (d *server) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	id := req.GetVolumeId()
	if err := validateID(id); err != nil {
		return nil, err
	}
	unlock, err := d.lockVolume(ctx, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	// An unknown volume or node is not published there, and the spec
	// asks for success when the volume can safely be regarded as
	// unpublished: COs retry unpublish after the volume is deleted.
	v := d.store.get(id)
	node := req.GetNodeId()
	if v == nil || len(v.Nodes) == 0 || (node != "" && node != d.nodeID) {
		return &csi.ControllerUnpublishVolumeResponse{}, nil
	}
	if node == "" {
		v.Nodes = nil
	} else {
		delete(v.Nodes, node)
	}
	if err := d.store.put(v); err != nil {
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}

// ValidateVolumeCapabilities confirms the capabilities if the driver
// supports all of them and the parameters are ones it takes.
func (d *server) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	id := req.GetVolumeId()
	if err := validateID(id); err != nil {
		return nil, err
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, invalid("volume_capabilities is required")
	}
	if d.store.get(id) == nil {
		return nil, status.Errorf(codes.NotFound, "volume %s does not exist", id)
	}
	if err := checkCapabilities("volume_capabilities", req.GetVolumeCapabilities()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: status.Convert(err).Message()}, nil
	}
	if err := checkParameters(req.GetParameters()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: status.Convert(err).Message()}, nil
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

// GetCapacity reports the free space in the state directory: images are
// sparse, so this is what new volumes can still grow into. A capability
// the driver does not support, or a topology without this node, has no
// capacity.
func (d *server) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	if err := checkCapabilities("volume_capabilities", req.GetVolumeCapabilities()); err != nil && len(req.GetVolumeCapabilities()) > 0 {
		return &csi.GetCapacityResponse{}, nil
	}
	if t := req.GetAccessibleTopology(); t != nil && !maps.Equal(t.GetSegments(), d.topology) {
		return &csi.GetCapacityResponse{}, nil
	}
	free, err := d.freeBytes()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	return &csi.GetCapacityResponse{
		AvailableCapacity: free,
		MinimumVolumeSize: wrapInt64(minVolumeSize),
	}, nil
}
