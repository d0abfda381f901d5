package driver

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"
)

// knownVolume returns the state of volume id or NotFound.
func (d *server) knownVolume(id string) (*volumeState, error) {
	v := d.store.get(id)
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %s does not exist", id)
	}
	return v, nil
}

// NodeStageVolume attaches the volume's image to a loop device (the one
// already attached, if any, unless it is being detached) and, for mount
// access, makes a file system on it if it has none and mounts it at the
// staging path. It never formats a device that already holds a file
// system. On failure it undoes what it did.
func (d *server) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	id, path := req.GetVolumeId(), req.GetStagingTargetPath()
	if err := validateID(id); err != nil {
		return nil, err
	}
	if err := d.validatePath("staging_target_path", path); err != nil {
		return nil, err
	}
	kind, err := checkCapability("volume_capability", req.GetVolumeCapability())
	if err != nil {
		return nil, err
	}
	fsType := req.GetVolumeCapability().GetMount().GetFsType()
	if kind == accessMount && fsType == "" {
		fsType = defaultFsType
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
	if err := checkStageRepeat(v, path, kind, fsType); err != nil {
		return nil, err
	}

	dev, attached, err := d.stageDevice(ctx, id)
	if err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx).WithValues("device", dev)
	// undo detaches a loop device this call attached: a failed stage must
	// not leak it. A device found attached is left as it was.
	undo := func() {
		if attached {
			if err := d.loop.Detach(context.WithoutCancel(ctx), dev); err != nil {
				logger.Error(err, "Rolling back a failed stage: detaching loop device")
			}
		}
	}
	if err := d.mid(ctx, "NodeStageVolume", id); err != nil {
		undo()
		return nil, err
	}

	mounted := false
	if kind == accessMount {
		if mounted, err = d.stageMount(ctx, id, dev, path, fsType, req.GetVolumeCapability().GetMount().GetMountFlags()); err != nil {
			undo()
			return nil, err
		}
	}
	v.Stage = &stageState{Path: path, Device: dev, Block: kind == accessBlock, FsType: fsType}
	if err := d.store.put(v); err != nil {
		if mounted {
			if uerr := d.mounter.Unmount(path); uerr != nil {
				logger.Error(uerr, "Rolling back a failed stage: unmounting", "path", path)
			}
		}
		undo()
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	logger.V(2).Info("Staged volume", "path", path, "block", kind == accessBlock, "fsType", fsType)
	return &csi.NodeStageVolumeResponse{}, nil
}

// stageDevice returns the loop device of volume id's image: one attached
// already (attached false), or one it attaches now.
func (d *server) stageDevice(ctx context.Context, id string) (dev string, attached bool, err error) {
	image := d.store.imagePath(id)
	devs, err := d.loop.Find(ctx, image)
	if err != nil {
		return "", false, status.Errorf(codes.Internal, "volume %s: %v", id, err)
	}
	// A device being detached goes away at its last close, whoever
	// staged on it: wait for it and attach anew.
	if devs, err = d.skipDetaching(ctx, id, image, devs); err != nil {
		return "", false, err
	}
	if len(devs) > 0 {
		return devs[0], false, nil
	}
	if dev, err = d.loop.Attach(ctx, image); err != nil {
		return "", false, status.Errorf(codes.Internal, "volume %s: %v", id, err)
	}
	return dev, true, nil
}

// checkStageRepeat fails a NodeStageVolume of v at path that cannot be
// done: of an inline ephemeral volume (never staged), or of a volume
// staged elsewhere or with another capability. A repeat is fine.
func checkStageRepeat(v *volumeState, path string, kind accessKind, fsType string) error {
	if v.Ephemeral != nil {
		return status.Errorf(codes.FailedPrecondition, "volume %s is an inline ephemeral volume: it is not staged", v.ID)
	}
	switch s := v.Stage; {
	case s == nil:
		return nil
	case s.Path != path:
		return status.Errorf(codes.FailedPrecondition, "volume %s is already staged at %s", v.ID, s.Path)
	case s.Block != (kind == accessBlock) || s.FsType != fsType:
		return status.Errorf(codes.AlreadyExists, "volume %s is already staged at %s with another volume capability (block=%v, fs_type=%q)", v.ID, path, s.Block, s.FsType)
	}
	return nil
}

// stageMount mounts dev's file system at path, formatting dev first if
// it holds none. It reports whether it mounted (false: already mounted).
func (d *server) stageMount(ctx context.Context, id, dev, path, fsType string, flags []string) (bool, error) {
	if err := os.MkdirAll(path, 0o750); err != nil {
		return false, status.Errorf(codes.Internal, "volume %s: creating staging path: %v", id, err)
	}
	if ok, err := mountedFrom(path, dev, false); err != nil {
		return false, status.Errorf(codes.Internal, "volume %s: %v", id, err)
	} else if ok {
		return false, nil
	}
	notMnt, err := d.mounter.IsLikelyNotMountPoint(path)
	if err != nil {
		return false, status.Errorf(codes.Internal, "volume %s: checking staging path: %v", id, err)
	}
	if !notMnt {
		return false, status.Errorf(codes.FailedPrecondition, "volume %s: staging path %s is a mount of something else", id, path)
	}
	if err := d.mounter.FormatAndMount(dev, path, fsType, flags); err != nil {
		code := codes.Internal
		var me mount.MountError
		if errors.As(err, &me) && me.Type == mount.FilesystemMismatch {
			code = codes.FailedPrecondition
		}
		return false, status.Errorf(code, "volume %s: formatting and mounting %s at %s: %v", id, dev, path, err)
	}
	return true, nil
}

// NodeUnstageVolume unmounts the staging path (if the volume is mounted
// there) and detaches every loop device backed by the volume's image.
// It returns once the devices are gone, which the kernel may defer
// while something else has one open (see detach.go), and fails with
// Unavailable if that takes too long. It refuses while the volume is
// still published on this node.
func (d *server) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	id, path := req.GetVolumeId(), req.GetStagingTargetPath()
	if err := validateID(id); err != nil {
		return nil, err
	}
	if err := d.validatePath("staging_target_path", path); err != nil {
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
	if len(v.Targets) > 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is still published at %v", id, targetList(v))
	}
	if v.Stage != nil && v.Stage.Path != path {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is staged at %s, not %s", id, v.Stage.Path, path)
	}
	image := d.store.imagePath(id)
	devs, err := d.loop.Find(ctx, image)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: %v", id, err)
	}
	for _, dev := range devs {
		// Unmount as long as the volume is mounted here: a crash may
		// have left more than one mount stacked on the path.
		for {
			ok, err := mountedFrom(path, dev, false)
			if err != nil {
				return nil, status.Errorf(codes.Internal, "volume %s: %v", id, err)
			}
			if !ok {
				break
			}
			if err := d.mounter.Unmount(path); err != nil {
				return nil, status.Errorf(codes.Internal, "volume %s: unmounting staging path: %v", id, err)
			}
		}
	}
	if err := d.mid(ctx, "NodeUnstageVolume", id); err != nil {
		return nil, err
	}
	if err := d.checkUnused(id, devs); err != nil {
		return nil, err
	}
	if err := d.requestDetach(ctx, id, image, devs); err != nil {
		return nil, err
	}
	// Forget the stage before waiting for the devices to go: if they do
	// not go in time, the volume is no longer usable as staged, and the
	// calls that find the devices wait for them (a retry of this one
	// too).
	if v.Stage != nil {
		v.Stage = nil
		if err := d.store.put(v); err != nil {
			return nil, status.Errorf(codes.Internal, "%v", err)
		}
	}
	if err := d.awaitDetached(ctx, id, image, devs); err != nil {
		return nil, err
	}
	klog.FromContext(ctx).V(2).Info("Unstaged volume", "path", path, "devices", devs)
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// checkUnused fails if any of devs is still mounted somewhere: detaching
// it would only mark it for removal once the last mount goes.
func (d *server) checkUnused(id string, devs []string) error {
	if len(devs) == 0 {
		return nil
	}
	mps, err := d.mounter.List()
	if err != nil {
		return status.Errorf(codes.Internal, "volume %s: listing mounts: %v", id, err)
	}
	var busy []string
	for _, mp := range mps {
		if slices.Contains(devs, mp.Device) {
			busy = append(busy, mp.Path)
		}
	}
	if len(busy) > 0 {
		return status.Errorf(codes.FailedPrecondition, "volume %s is still mounted at %v", id, busy)
	}
	return nil
}

func targetList(v *volumeState) []string {
	var ts []string
	for t := range v.Targets {
		ts = append(ts, t)
	}
	slices.Sort(ts)
	return ts
}

// mountedFrom reports whether path shows dev: for a file system, whether
// path is on dev's file system; for a block device (block true), whether
// path is dev's device node. It compares device numbers, so it needs no
// mount table and works for bind mounts. A missing path is not mounted.
func mountedFrom(path, dev string, block bool) (bool, error) {
	var ds, ps syscall.Stat_t
	if err := syscall.Stat(dev, &ds); err != nil {
		return false, fmt.Errorf("stat %s: %w", dev, err)
	}
	if err := syscall.Stat(path, &ps); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		return false, fmt.Errorf("stat %s: %w", path, err)
	}
	if block {
		return ps.Mode&syscall.S_IFMT == syscall.S_IFBLK && ps.Rdev == ds.Rdev, nil
	}
	return ps.Dev == ds.Rdev, nil
}

// parentExists fails unless the parent directory of path exists: the CO
// creates it (the kubelet's pod volume directory), the driver only
// creates the last element.
func parentExists(id, path string) error {
	if _, err := os.Stat(filepath.Dir(path)); err != nil {
		return status.Errorf(codes.FailedPrecondition, "volume %s: parent of target path: %v", id, err)
	}
	return nil
}
