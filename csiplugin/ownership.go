package csiplugin

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/cache"
)

// Permission bits a pod's fsGroup gets on a volume's files, the kubelet's.
const (
	groupRW   fs.FileMode = 0o660
	groupExec fs.FileMode = 0o110
)

// needsOwnership reports whether nodevol must give the pod's fsGroup
// ownership of a published volume itself, as the kubelet does: the driver
// cannot (it lacks VOLUME_MOUNT_GROUP), the volume is writable, and the
// CSIDriver's fsGroupPolicy allows it (File: always; the default
// ReadWriteOnceWithFSType: only for a volume with an fsType that is
// ReadWriteOnce, or an inline volume).
func needsOwnership(spec *cache.VolumeSpec, vol cache.PodVolume, caps Capabilities, driver *storagev1.CSIDriver) bool {
	if vol.FSGroup == nil || caps.VolumeMountGroup || vol.ReadOnly || spec.ReadOnly {
		return false
	}
	policy := storagev1.ReadWriteOnceWithFSTypeFSGroupPolicy
	if driver != nil && driver.Spec.FSGroupPolicy != nil {
		policy = *driver.Spec.FSGroupPolicy
	}
	switch policy {
	case storagev1.FileFSGroupPolicy:
		return true
	case storagev1.ReadWriteOnceWithFSTypeFSGroupPolicy:
		return spec.FSType != "" && (spec.Ephemeral || spec.AccessMode == "" || spec.AccessMode == "ReadWriteOnce")
	}
	return false
}

// setOwnership gives group gid ownership of everything under dir, with
// group read-write permission and setgid on directories (only writable
// volumes get here, see needsOwnership). Children come before their directory, so that the root is
// changed last: with onRootMismatch a root that already has the right
// group and permissions means a finished earlier walk, and nothing is
// done. Symbolic links get their group but no chmod (it would change their
// targets). As in the kubelet, a file whose group or mode cannot be changed
// is logged, not fatal; an unreadable directory is an error.
func setOwnership(ctx context.Context, dir string, gid int64, onRootMismatch bool) error {
	if onRootMismatch && rootHasOwnership(dir, gid) {
		return nil
	}
	logger := klog.FromContext(ctx)
	return walkChildrenFirst(ctx, dir, func(path string, info fs.FileInfo) {
		if err := os.Lchown(path, -1, int(gid)); err != nil {
			logger.Error(err, "Changing the group of a volume file failed", "path", path, "fsGroup", gid)
		}
		if info.Mode()&fs.ModeSymlink != 0 {
			return
		}
		mask := groupRW
		if info.IsDir() {
			mask |= fs.ModeSetgid | groupExec
		}
		if err := os.Chmod(path, info.Mode()|mask); err != nil {
			logger.Error(err, "Changing the mode of a volume file failed", "path", path, "fsGroup", gid)
		}
	})
}

// rootHasOwnership reports whether dir already has group gid, the group
// permissions and setgid.
func rootHasOwnership(dir string, gid int64) bool {
	info, err := os.Stat(dir)
	if err != nil || !info.IsDir() {
		return false
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok || int64(st.Gid) != gid {
		return false
	}
	want := groupRW | groupExec
	return info.Mode().Perm()&want == want && info.Mode()&fs.ModeSetgid != 0
}

// walkChildrenFirst calls f for everything under root, each directory after
// its entries, without following symbolic links. It stops when ctx ends.
func walkChildrenFirst(ctx context.Context, root string, f func(string, fs.FileInfo)) error {
	info, err := os.Lstat(root)
	if err != nil {
		return err
	}
	var walk func(path string, info fs.FileInfo) error
	walk = func(path string, info fs.FileInfo) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if info.IsDir() {
			entries, err := os.ReadDir(path)
			if err != nil {
				return err
			}
			for _, e := range entries {
				child := filepath.Join(path, e.Name())
				ci, err := os.Lstat(child)
				if errors.Is(err, fs.ErrNotExist) {
					continue // removed meanwhile
				}
				if err != nil {
					return err
				}
				if err := walk(child, ci); err != nil {
					return err
				}
			}
		}
		f(path, info)
		return nil
	}
	return walk(root, info)
}
