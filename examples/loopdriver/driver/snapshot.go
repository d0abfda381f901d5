package driver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/internal/fsutil"
)

// snapshotIDFor derives a snapshot's ID from its name, so that a retried
// CreateSnapshot finds it even after a crash before the answer.
func snapshotIDFor(name string) string {
	sum := sha256.Sum256([]byte(name))
	return "snap-" + hex.EncodeToString(sum[:10])
}

// validateSnapshotID checks a snapshot ID from a request (field names it).
func validateSnapshotID(field, id string) error {
	if id == "" {
		return invalid("%s is required", field)
	}
	if err := fsutil.ValidateName(field, id); err != nil {
		return invalid("%v", err)
	}
	return nil
}

// snapshotLock is the lock key of a snapshot, apart from volume IDs.
func snapshotLock(id string) string { return "snapshot/" + id }

func (d *server) csiSnapshot(sn *snapshotState) *csi.Snapshot {
	return &csi.Snapshot{
		SnapshotId:     sn.ID,
		SourceVolumeId: sn.SourceVolumeID,
		SizeBytes:      sn.SizeBytes,
		CreationTime:   timestamppb.New(time.Unix(0, sn.CreatedUnixNano)),
		ReadyToUse:     true,
	}
}

// CreateSnapshot copies the source volume's image, keeping its holes. A
// second call with the same name and source returns the same snapshot;
// the same name with another source is AlreadyExists.
func (d *server) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	name, src := req.GetName(), req.GetSourceVolumeId()
	if name == "" {
		return nil, invalid("name is required")
	}
	if strings.IndexByte(name, 0) >= 0 {
		return nil, invalid("name must not contain a NUL byte")
	}
	if src == "" {
		return nil, invalid("source_volume_id is required")
	}
	if err := fsutil.ValidateName("source_volume_id", src); err != nil {
		return nil, invalid("%v", err)
	}
	id := snapshotIDFor(name)
	unlockVol, err := d.lockVolume(ctx, src)
	if err != nil {
		return nil, err
	}
	defer unlockVol()
	unlock, err := d.lockVolume(ctx, snapshotLock(id))
	if err != nil {
		return nil, err
	}
	defer unlock()
	if sn := d.snaps.get(id); sn != nil {
		if sn.Name != name || sn.SourceVolumeID != src {
			return nil, status.Errorf(codes.AlreadyExists, "snapshot %q exists with source volume %s, not %s", name, sn.SourceVolumeID, src)
		}
		return &csi.CreateSnapshotResponse{Snapshot: d.csiSnapshot(sn)}, nil
	}
	v := d.store.get(src)
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "source_volume_id %s: no such volume", src)
	}
	if err := copySparse(d.snaps.imagePath(id), d.store.imagePath(src), v.CapacityBytes); err != nil {
		return nil, status.Errorf(codes.Internal, "snapshot %s of volume %s: %v", id, src, err)
	}
	if err := d.mid(ctx, "CreateSnapshot", id); err != nil {
		_ = d.snaps.remove(id)
		return nil, err
	}
	sn := &snapshotState{ID: id, Name: name, SourceVolumeID: src, SizeBytes: v.CapacityBytes, CreatedUnixNano: time.Now().UnixNano()}
	if err := d.snaps.put(sn); err != nil {
		_ = d.snaps.remove(id)
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	klog.FromContext(ctx).V(2).Info("Created snapshot", "snapshotID", id, "name", name, "sourceVolumeID", src)
	return &csi.CreateSnapshotResponse{Snapshot: d.csiSnapshot(sn)}, nil
}

// DeleteSnapshot deletes a snapshot's image and state; an unknown
// snapshot is already deleted. Volumes made from it are copies and stay.
func (d *server) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	id := req.GetSnapshotId()
	if err := validateSnapshotID("snapshot_id", id); err != nil {
		return nil, err
	}
	unlock, err := d.lockVolume(ctx, snapshotLock(id))
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := d.snaps.remove(id); err != nil {
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	return &csi.DeleteSnapshotResponse{}, nil
}

// GetSnapshot returns one snapshot.
func (d *server) GetSnapshot(ctx context.Context, req *csi.GetSnapshotRequest) (*csi.GetSnapshotResponse, error) {
	id := req.GetSnapshotId()
	if err := validateSnapshotID("snapshot_id", id); err != nil {
		return nil, err
	}
	sn := d.snaps.get(id)
	if sn == nil {
		return nil, status.Errorf(codes.NotFound, "snapshot %s not found", id)
	}
	return &csi.GetSnapshotResponse{Snapshot: d.csiSnapshot(sn)}, nil
}

// ListSnapshots lists snapshots by ID, filtered by snapshot_id and
// source_volume_id, max_entries at a time.
func (d *server) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	all := d.snaps.list()
	snaps := all[:0]
	for _, sn := range all {
		if (req.GetSnapshotId() == "" || sn.ID == req.GetSnapshotId()) &&
			(req.GetSourceVolumeId() == "" || sn.SourceVolumeID == req.GetSourceVolumeId()) {
			snaps = append(snaps, sn)
		}
	}
	ids := make([]string, len(snaps))
	for i, sn := range snaps {
		ids[i] = sn.ID
	}
	start, end, next, err := pageIDs(ids, req.GetMaxEntries(), req.GetStartingToken())
	if err != nil {
		return nil, err
	}
	resp := &csi.ListSnapshotsResponse{NextToken: next}
	for _, sn := range snaps[start:end] {
		resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: d.csiSnapshot(sn)})
	}
	return resp, nil
}
