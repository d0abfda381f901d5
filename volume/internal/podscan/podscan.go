// Package podscan is what the plugins whose volumes are pod directories
// share at reconstruction: the walk of every
// {root}/pods/{uid}/volumes/{plugin}/{name} (emptyDir and the kinds that
// wrap it, nfs), and the removal of such a directory found unreadable.
// Neither follows a symlink below the root (internal/rootfs).
package podscan

import (
	"context"
	"errors"
	"io/fs"
	"path"
	"path/filepath"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/internal/rootfs"
	"github.com/nodevol/nodevol/volume"
)

// Found reconstructs one entry e of pod uid's directory of the plugin's
// volumes, at abs; ok is false (the plugin logs why) when it is not a
// volume the plugin can take down, and it is then listed unreadable.
type Found func(uid types.UID, e fs.DirEntry, abs string) (m volume.FoundMount, ok bool)

// Scan walks the pod volume directories of the plugin whose name, escaped
// as a path element, is escaped (as "kubernetes.io~nfs"), below r rooted
// at root, and gives each entry to found. A pod directory that is a
// symlink is skipped; a plugin directory that cannot be listed is logged
// and listed unreadable. kind names the volumes in the log ("nfs").
// Nothing is removed.
func Scan(logger klog.Logger, r *rootfs.Root, root, escaped, kind string, found Found) volume.Found {
	var out volume.Found
	pods, err := r.ReadDir("pods")
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			logger.Error(err, "Cannot list the pod directories: no "+kind+" volume is reconstructed")
		}
		return out
	}
	for _, pe := range pods {
		if !pe.IsDir() {
			continue // not a pod directory; a symlink is not followed
		}
		uid := types.UID(pe.Name())
		rel := path.Join("pods", pe.Name(), "volumes", escaped)
		entries, err := r.ReadDir(rel)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue
		case err != nil:
			logger.Error(err, "Cannot list the pod's "+kind+" volumes, leaving them alone", "podUID", uid)
			out.Attempted++
			out.Unreadable = append(out.Unreadable, filepath.Join(root, rel))
			continue
		}
		for _, e := range entries {
			out.Attempted++
			abs := filepath.Join(root, rel, e.Name())
			if m, ok := found(uid, e, abs); ok {
				out.Mounts = append(out.Mounts, m)
			} else {
				out.Unreadable = append(out.Unreadable, abs)
			}
		}
	}
	return out
}

// RemoveEmptyDir is a Retake for a plugin whose volume directories hold
// nothing of its own: dir, found unreadable at start, is removed only when
// it is an empty directory (never a file or a symlink) below r that the
// mount table (mounted, nil when unknown) does not list as a mount point.
// It reports whether dir is gone. kind names the volumes in the log.
func RemoveEmptyDir(ctx context.Context, r *rootfs.Root, dir string, mounted map[string]bool, kind string) bool {
	if mounted == nil || mounted[dir] {
		return false
	}
	if _, err := r.Rel(dir); err != nil {
		return false
	}
	if fi, err := r.Lstat(dir); err != nil || !fi.IsDir() {
		return false // what is not a directory is not the plugin's to remove
	}
	if err := r.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false
	}
	klog.FromContext(ctx).Info("Removed a "+kind+" volume directory found unreadable at start", "path", dir)
	return true
}
