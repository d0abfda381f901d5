package volumemanager

import (
	"context"
	"errors"
	"io/fs"
	"path"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/internal/rootfs"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/subpath"
)

// podDir names one volume's directory of subPath bind mounts,
// {root}/pods/{pod}/volume-subpaths/{dir}; with dir "", the pod's
// volume-subpaths directory, empty.
type podDir struct {
	pod types.UID
	dir string
}

// cleanDroppedSubPaths cleans, at start, the subPath bind mount
// directories of the pod volumes that no plugin reconstructed. The
// teardown of a volume cleans its subPath mounts before it unpublishes it
// (cleanSubPaths); a volume a plugin drops at reconstruction instead (the
// CSI plugin removes a pod volume's leftovers itself when the node
// rebooted since they were written) is never torn down, and its subPath
// targets, which the reboot unmounted, would stay for ever, and with them
// the pod's volume-subpaths directory, which keeps the kubelet from ever
// removing the pod's directory. The kubelet reconstructs such a volume
// and tears it down, subPath mounts first.
//
// Only a volume's subPath directory with no mount point below it in the
// mount table read at start (rc) is cleaned, and CleanVolume removes
// nothing but the empty targets and directories it makes: a mounted
// target may be a running container's (that of a hostPath volume, which
// leaves nothing on disk to reconstruct), and it stays until its volume
// is torn down. It runs before the actual state is installed, when no
// volume's path has been given out by this manager yet for a Prepare.
func (vm *VolumeManager) cleanDroppedSubPaths(ctx context.Context, rc volume.Recovery, found volume.Found) {
	if rc.MountPoints == nil {
		return // the mount table is unknown: any target may be mounted
	}
	logger := klog.FromContext(ctx)
	r, err := rootfs.New(vm.cfg.RootDir)
	if err != nil {
		logger.Error(err, "Cannot look for the subPath mounts of volumes found on disk")
		return
	}
	kept := vm.subPathDirsKept(r, rc, found)
	for _, d := range subPathDirs(logger, r) {
		if kept[d] {
			continue
		}
		clean := func() error { return vm.subpaths.CleanVolume(ctx, d.pod, d.dir) }
		if d.dir == "" {
			// Left empty by a CleanVolume cut short: the last step of
			// every one.
			clean = func() error { return vm.subpaths.CleanPod(ctx, d.pod) }
		}
		if err := clean(); err != nil {
			logger.Error(err, "Cannot clean the subPath mounts of a pod volume no plugin found on disk", "podUID", d.pod, "volume", d.dir)
			continue
		}
		logger.Info("Cleaned the subPath mounts of a pod volume no plugin found on disk", "podUID", d.pod, "volume", d.dir)
	}
}

// subPathDirsKept are the volumes' subPath directories that stay: those of
// the volumes found on disk (Mounts, and Unreadable ones, which name a
// pod volume directory), and those with a mount point below them.
func (vm *VolumeManager) subPathDirsKept(r *rootfs.Root, rc volume.Recovery, found volume.Found) map[podDir]bool {
	kept := map[podDir]bool{}
	for _, m := range found.Mounts {
		kept[podDir{m.Volume.Pod.UID, ondisk.VolumeDirName(&m.Spec, m.Volume)}] = true
	}
	for _, p := range found.Unreadable {
		// pods/{uid}/volumes/{plugin}/{name}
		if parts := relParts(r, p); len(parts) == 5 && parts[0] == "pods" && parts[2] == "volumes" {
			kept[podDir{types.UID(parts[1]), parts[4]}] = true
		}
	}
	for p := range rc.MountPoints {
		// pods/{uid}/volume-subpaths/{dir}/...
		if parts := relParts(r, p); len(parts) > 4 && parts[0] == "pods" && parts[2] == subpath.DirName {
			kept[podDir{types.UID(parts[1]), parts[3]}] = true
		}
	}
	return kept
}

// relParts splits p, an absolute path, into its components below the
// root; nil when it is not below it.
func relParts(r *rootfs.Root, p string) []string {
	rel, err := r.Rel(p)
	if err != nil || rel == "." {
		return nil
	}
	return strings.Split(filepath.ToSlash(rel), "/")
}

// subPathDirs lists every pods/{uid}/volume-subpaths/{dir} directory, and
// every pods/{uid}/volume-subpaths that is empty, following no symlink;
// what cannot be listed is logged and skipped.
func subPathDirs(logger klog.Logger, r *rootfs.Root) []podDir {
	pods, err := r.ReadDir("pods")
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			logger.Error(err, "Cannot list the pod directories for subPath mounts")
		}
		return nil
	}
	var out []podDir
	for _, pe := range pods {
		if !pe.IsDir() {
			continue
		}
		vols, err := r.ReadDir(path.Join("pods", pe.Name(), subpath.DirName))
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				logger.Error(err, "Cannot list the pod's subPath mounts", "podUID", pe.Name())
			}
			continue
		}
		if len(vols) == 0 {
			out = append(out, podDir{pod: types.UID(pe.Name())})
		}
		for _, ve := range vols {
			if ve.IsDir() {
				out = append(out, podDir{types.UID(pe.Name()), ve.Name()})
			}
		}
	}
	return out
}
