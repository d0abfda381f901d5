package driver

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"
)

// Inline ephemeral volumes (the CSIDriver's volumeLifecycleModes has
// Ephemeral): the kubelet calls NodePublishVolume without staging, with a
// volume ID of its own (csi-<sha256 of pod UID and volume name>) and the
// pod's volumeAttributes, and NodeUnpublishVolume when the pod goes. The
// volume lives exactly that long: publish makes its image, attaches it to
// a loop device, makes an ext4 (or the capability's fs_type) and mounts
// it at the target; unpublish unmounts, detaches and deletes it.

const (
	// ephemeralKey is the volume_context key with which the kubelet says
	// whether a publish is of an inline ephemeral volume (sent with the
	// other pod information when the CSIDriver has podInfoOnMount).
	ephemeralKey = "csi.storage.k8s.io/ephemeral"
	// SizeAttribute is the volumeAttributes key of an inline ephemeral
	// volume's size, a Kubernetes quantity ("64Mi"); 64 MiB
	// when missing.
	SizeAttribute = "size"
)

// ephemeralState marks a volume made by NodePublishVolume for an inline
// ephemeral volume, and says where and how: it exists from before the
// image is made until the image is deleted, so that a restarted driver
// finishes a publish or an unpublish that a crash interrupted.
type ephemeralState struct {
	// Target is the one target path the volume is for.
	Target string `json:"target"`
	FsType string `json:"fsType"`
}

// isEphemeralPublish reports whether req publishes an inline ephemeral
// volume: the kubelet says so in volume_context, or (without
// podInfoOnMount it says nothing) gives no staging path, which it always
// gives for a persistent volume of a driver that stages.
func isEphemeralPublish(req *csi.NodePublishVolumeRequest) bool {
	e, ok := req.GetVolumeContext()[ephemeralKey]
	return e == "true" || (!ok && req.GetStagingTargetPath() == "")
}

// ephemeralSize is the image size an inline volume's attributes ask for.
// Attributes other than size and the kubelet's csi.storage.k8s.io/ ones
// are refused, as CreateVolume refuses unknown parameters.
func ephemeralSize(attrs map[string]string) (int64, error) {
	var required int64
	for k, val := range attrs {
		switch {
		case k == SizeAttribute:
			q, err := resource.ParseQuantity(val)
			if err != nil || q.Sign() <= 0 {
				return 0, invalid("volume_context: %s %q is not a positive quantity (e.g. 64Mi)", SizeAttribute, val)
			}
			required = q.Value()
		case strings.HasPrefix(k, "csi.storage.k8s.io/"):
		default:
			return 0, invalid("volume_context: unknown attribute %q of an ephemeral volume (this driver takes %q)", k, SizeAttribute)
		}
	}
	if required == 0 {
		return defaultVolumeSize, nil
	}
	return pickSize(&csi.CapacityRange{RequiredBytes: required})
}

// publishEphemeral is NodePublishVolume of an inline ephemeral volume:
// it makes the volume on the first call and mounts it at the target. A
// repeated call with the same target and attributes succeeds and finishes
// what an earlier one left undone; a volume made by this call is deleted
// again if the call fails.
func (d *server) publishEphemeral(ctx context.Context, req *csi.NodePublishVolumeRequest, kind accessKind) (*csi.NodePublishVolumeResponse, error) {
	id, target, c := req.GetVolumeId(), req.GetTargetPath(), req.GetVolumeCapability()
	switch {
	case req.GetStagingTargetPath() != "":
		return nil, invalid("volume %s: staging_target_path must be empty for an ephemeral volume", id)
	case kind == accessBlock:
		return nil, invalid("volume %s: an ephemeral volume has mount access, not block", id)
	case req.GetReadonly() || readOnlyMode(c):
		return nil, invalid("volume %s: a read-only ephemeral volume would stay empty", id)
	}
	size, err := ephemeralSize(req.GetVolumeContext())
	if err != nil {
		return nil, err
	}
	fsType := c.GetMount().GetFsType()
	if fsType == "" {
		fsType = defaultFsType
	}
	unlock, err := d.lockVolume(ctx, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	v := d.store.get(id)
	created := false
	switch {
	case v == nil:
		if err := parentExists(id, target); err != nil {
			return nil, err
		}
		if free, err := d.freeBytes(); err != nil {
			return nil, status.Errorf(codes.Internal, "volume %s: %v", id, err)
		} else if size > free {
			return nil, status.Errorf(codes.ResourceExhausted, "volume %s: %d bytes requested, %d free in the state directory", id, size, free)
		}
		v = &volumeState{ID: id, Name: id, CapacityBytes: size, Ephemeral: &ephemeralState{Target: target, FsType: fsType}}
		if err := d.store.put(v); err != nil {
			return nil, status.Errorf(codes.Internal, "%v", err)
		}
		created = true
	case v.Ephemeral == nil:
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is a provisioned volume, not an ephemeral one: call NodeStageVolume first", id)
	case v.Ephemeral.Target != target:
		return nil, status.Errorf(codes.FailedPrecondition, "ephemeral volume %s is published at %s, not %s", id, v.Ephemeral.Target, target)
	case v.CapacityBytes != size || v.Ephemeral.FsType != fsType:
		return nil, status.Errorf(codes.AlreadyExists, "ephemeral volume %s exists with %d bytes and fs_type %q", id, v.CapacityBytes, v.Ephemeral.FsType)
	}
	if err := d.mountEphemeral(ctx, v, c.GetMount().GetMountFlags()); err != nil {
		if created {
			if rerr := d.removeEphemeral(context.WithoutCancel(ctx), v); rerr != nil {
				klog.FromContext(ctx).Error(rerr, "Rolling back a failed ephemeral publish", "target", target)
			}
		}
		return nil, err
	}
	klog.FromContext(ctx).V(2).Info("Published ephemeral volume", "target", target, "bytes", size, "fsType", fsType)
	return &csi.NodePublishVolumeResponse{}, nil
}

// mountEphemeral makes what is missing of the ephemeral volume v (its
// image, its loop device, its file system and the mount at its target)
// and records the target as published.
func (d *server) mountEphemeral(ctx context.Context, v *volumeState, flags []string) error {
	id, target := v.ID, v.Ephemeral.Target
	image := d.store.imagePath(id)
	if _, err := os.Stat(image); errors.Is(err, fs.ErrNotExist) {
		if err := d.writeImage(id, v.CapacityBytes); err != nil {
			return status.Errorf(codes.Internal, "volume %s: %v", id, err)
		}
	} else if err != nil {
		return status.Errorf(codes.Internal, "volume %s: %v", id, err)
	}
	devs, err := d.loop.Find(ctx, image)
	if err != nil {
		return status.Errorf(codes.Internal, "volume %s: %v", id, err)
	}
	if devs, err = d.skipDetaching(ctx, id, image, devs); err != nil {
		return err
	}
	var dev string
	if len(devs) > 0 {
		dev = devs[0]
	} else if dev, err = d.loop.Attach(ctx, image); err != nil {
		return status.Errorf(codes.Internal, "volume %s: %v", id, err)
	}
	if _, err := d.stageMount(ctx, id, dev, target, v.Ephemeral.FsType, flags); err != nil {
		return err
	}
	if err := d.mid(ctx, "NodePublishVolume", id); err != nil {
		return err
	}
	want := targetState{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER.String()}
	if old, ok := v.Targets[target]; !ok || old != want {
		v.Targets = map[string]targetState{target: want}
		if err := d.store.put(v); err != nil {
			return status.Errorf(codes.Internal, "%v", err)
		}
	}
	return nil
}

// unpublishEphemeral is NodeUnpublishVolume of the ephemeral volume v at
// its target: the volume is unmounted, detached and deleted.
func (d *server) unpublishEphemeral(ctx context.Context, v *volumeState) (*csi.NodeUnpublishVolumeResponse, error) {
	target := v.Ephemeral.Target
	if err := mount.CleanupMountPoint(target, d.mounter, true); err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: unpublishing %s: %v", v.ID, target, err)
	}
	if err := d.mid(ctx, "NodeUnpublishVolume", v.ID); err != nil {
		return nil, err
	}
	if err := d.removeEphemeral(ctx, v); err != nil {
		return nil, err
	}
	klog.FromContext(ctx).V(2).Info("Unpublished and deleted ephemeral volume", "target", target)
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// removeEphemeral undoes all of the ephemeral volume v: the mount at its
// target (and the target directory), its loop devices (waiting until they
// are gone), its image and, last, its state file, so that a crash part
// way leaves a record that the next NodeUnpublishVolume finishes.
func (d *server) removeEphemeral(ctx context.Context, v *volumeState) error {
	id := v.ID
	if err := mount.CleanupMountPoint(v.Ephemeral.Target, d.mounter, true); err != nil {
		return status.Errorf(codes.Internal, "volume %s: unmounting %s: %v", id, v.Ephemeral.Target, err)
	}
	image := d.store.imagePath(id)
	devs, err := d.loop.Find(ctx, image)
	if err != nil {
		return status.Errorf(codes.Internal, "volume %s: %v", id, err)
	}
	if err := d.checkUnused(id, devs); err != nil {
		return err
	}
	if err := d.requestDetach(ctx, id, image, devs); err != nil {
		return err
	}
	if err := d.awaitDetached(ctx, id, image, devs); err != nil {
		return err
	}
	if err := d.store.remove(id); err != nil {
		return status.Errorf(codes.Internal, "%v", err)
	}
	return nil
}
