package driver

import (
	"context"
	"errors"
	"io/fs"
	"os"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"
)

// NodePublishVolume bind-mounts the staged file system onto the target
// directory, or the staged loop device onto the target file, creating
// the directory or file if missing (but not its parent). The mount is
// read-only if the request, the access mode or the controller
// publication says so. On failure it undoes what it did.
func (d *server) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	id, target, staging := req.GetVolumeId(), req.GetTargetPath(), req.GetStagingTargetPath()
	if err := validateID(id); err != nil {
		return nil, err
	}
	if err := d.validatePath("target_path", target); err != nil {
		return nil, err
	}
	kind, err := checkCapability("volume_capability", req.GetVolumeCapability())
	if err != nil {
		return nil, err
	}
	if isEphemeralPublish(req) {
		return d.publishEphemeral(ctx, req, kind)
	}
	if err := d.validatePath("staging_target_path", staging); err != nil {
		return nil, err
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
	if err := checkStaged(v, staging, kind); err != nil {
		return nil, err
	}
	want := targetState{
		Block:    kind == accessBlock,
		ReadOnly: req.GetReadonly() || readOnlyMode(req.GetVolumeCapability()) || v.Nodes[d.nodeID].ReadOnly,
		Mode:     req.GetVolumeCapability().GetAccessMode().GetMode().String(),
	}
	if old, ok := v.Targets[target]; ok && old != want {
		return nil, status.Errorf(codes.AlreadyExists, "volume %s is already published at %s with readonly=%v, mode %s", id, target, old.ReadOnly, old.Mode)
	}
	if err := checkSingleWriter(id, target, want, v); err != nil {
		return nil, err
	}
	devs, err := d.loop.Find(ctx, d.store.imagePath(id))
	if err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: %v", id, err)
	}
	if len(devs) == 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is recorded as staged but no loop device is attached: call NodeStageVolume again", id)
	}
	dev := devs[0]
	if err := parentExists(id, target); err != nil {
		return nil, err
	}
	source := staging
	if want.Block {
		source = dev
	}
	undo, err := d.bindMount(ctx, id, source, dev, target, want)
	if err != nil {
		return nil, err
	}
	if err := d.mid(ctx, "NodePublishVolume", id); err != nil {
		undo()
		return nil, err
	}
	if old, ok := v.Targets[target]; !ok || old != want {
		if v.Targets == nil {
			v.Targets = map[string]targetState{}
		}
		v.Targets[target] = want
		if err := d.store.put(v); err != nil {
			undo()
			return nil, status.Errorf(codes.Internal, "%v", err)
		}
	}
	klog.FromContext(ctx).V(2).Info("Published volume", "target", target, "readOnly", want.ReadOnly, "block", want.Block)
	return &csi.NodePublishVolumeResponse{}, nil
}

// checkStaged fails unless v is staged at staging for kind's access, as
// a publish of a provisioned volume needs.
func checkStaged(v *volumeState, staging string, kind accessKind) error {
	switch s := v.Stage; {
	case s == nil:
		return status.Errorf(codes.FailedPrecondition, "volume %s is not staged: call NodeStageVolume first", v.ID)
	case s.Path != staging:
		return status.Errorf(codes.FailedPrecondition, "volume %s is staged at %s, not %s", v.ID, s.Path, staging)
	case s.Block != (kind == accessBlock):
		return status.Errorf(codes.FailedPrecondition, "volume %s is staged with block=%v, cannot publish it with block=%v", v.ID, s.Block, kind == accessBlock)
	}
	return nil
}

// checkSingleWriter enforces SINGLE_NODE_SINGLE_WRITER: a volume
// published with it may have only one target path.
func checkSingleWriter(id, target string, want targetState, v *volumeState) error {
	const single = "SINGLE_NODE_SINGLE_WRITER"
	for t, s := range v.Targets {
		if t != target && (s.Mode == single || want.Mode == single) {
			return status.Errorf(codes.FailedPrecondition, "volume %s is published at %s and one of the publications is %s", id, t, single)
		}
	}
	return nil
}

// bindMount makes target show source (the staging directory, or the
// loop device dev for block access), unless it already shows dev. The
// returned undo removes what it made.
func (d *server) bindMount(ctx context.Context, id, source, dev, target string, want targetState) (func(), error) {
	created := false
	_, err := os.Lstat(target)
	switch {
	case errors.Is(err, fs.ErrNotExist) && want.Block:
		f, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o640)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "volume %s: creating target file: %v", id, err)
		}
		_ = f.Close()
		created = true
	case errors.Is(err, fs.ErrNotExist):
		if err := os.Mkdir(target, 0o750); err != nil {
			return nil, status.Errorf(codes.Internal, "volume %s: creating target directory: %v", id, err)
		}
		created = true
	case err != nil:
		return nil, status.Errorf(codes.Internal, "volume %s: target path: %v", id, err)
	}
	removeCreated := func() {
		if created {
			_ = os.Remove(target)
		}
	}
	if ok, err := mountedFrom(target, dev, want.Block); err != nil {
		removeCreated()
		return nil, status.Errorf(codes.Internal, "volume %s: %v", id, err)
	} else if ok {
		return func() {}, nil
	}
	if !want.Block {
		notMnt, err := d.mounter.IsLikelyNotMountPoint(target)
		if err != nil || !notMnt {
			removeCreated()
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s: target path %s is a mount of something else (%v)", id, target, err)
		}
	}
	opts := []string{"bind"}
	if want.ReadOnly {
		opts = append(opts, "ro")
	}
	if err := d.mounter.Mount(source, target, "", opts); err != nil {
		// A bind mount with "ro" is a mount and a remount: if the
		// remount failed, the first half may be there.
		_ = mount.CleanupMountPoint(target, d.mounter, true)
		removeCreated()
		return nil, status.Errorf(codes.Internal, "volume %s: bind-mounting %s at %s: %v", id, source, target, err)
	}
	logger := klog.FromContext(ctx)
	return func() {
		if err := mount.CleanupMountPoint(target, d.mounter, true); err != nil {
			logger.Error(err, "Rolling back a failed publish", "target", target)
		}
	}, nil
}

// NodeUnpublishVolume unmounts the target path and removes it; an
// inline ephemeral volume published there is deleted too (see
// ephemeral.go). A target that is already gone is success, even of a
// volume the driver does not know (an ephemeral volume deleted by an
// earlier call whose answer was lost); an unknown volume whose target
// path exists is NotFound.
func (d *server) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	id, target := req.GetVolumeId(), req.GetTargetPath()
	if err := validateID(id); err != nil {
		return nil, err
	}
	if err := d.validatePath("target_path", target); err != nil {
		return nil, err
	}
	unlock, err := d.lockVolume(ctx, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	v := d.store.get(id)
	if v == nil {
		return unpublishUnknown(id, target)
	}
	if v.Ephemeral != nil && v.Ephemeral.Target == target {
		return d.unpublishEphemeral(ctx, v)
	}
	if err := mount.CleanupMountPoint(target, d.mounter, true); err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: unpublishing %s: %v", id, target, err)
	}
	if err := d.mid(ctx, "NodeUnpublishVolume", id); err != nil {
		return nil, err
	}
	if _, ok := v.Targets[target]; ok {
		delete(v.Targets, target)
		if err := d.store.put(v); err != nil {
			return nil, status.Errorf(codes.Internal, "%v", err)
		}
	}
	klog.FromContext(ctx).V(2).Info("Unpublished volume", "target", target)
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// unpublishUnknown answers NodeUnpublishVolume of a volume the driver
// does not know: success if nothing is at the target path, NotFound
// otherwise (the driver touches no mount it did not make).
func unpublishUnknown(id, target string) (*csi.NodeUnpublishVolumeResponse, error) {
	if _, err := os.Lstat(target); errors.Is(err, fs.ErrNotExist) {
		return &csi.NodeUnpublishVolumeResponse{}, nil
	} else if err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: target path: %v", id, err)
	}
	return nil, status.Errorf(codes.NotFound, "volume %s does not exist", id)
}
