package nfs

import (
	"context"
	"errors"
	"io/fs"
	"path"
	"path/filepath"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/cache"
	"github.com/nodevol/nodevol/internal/fsutil"
	"github.com/nodevol/nodevol/volume"
)

// Reconstruct implements volume.Reconstructor: it returns the nfs volumes
// the kubelet or an earlier run left, each directory
// {root}/pods/{uid}/volumes/kubernetes.io~nfs/{name}: Mounted when
// rc.MountPoints shows it mounted, else Uncertain (a directory a cut-short
// SetUp or TearDown left, or a reboot), so that it is mounted again for a
// pod that still wants it, or torn down. Each is named as the volume
// manager names a pod's nfs volume, {plugin}/{podUID}-{name} (the name is
// the PV's for a claim, as the directory's), which is all TearDown needs.
// Nothing is removed, and no symlink below the root is followed: a
// directory that cannot be listed, and anything but a directory where a
// volume directory is expected, are logged and listed as unreadable.
func (p *plugin) Reconstruct(ctx context.Context, rc volume.Recovery) volume.Found {
	logger := klog.FromContext(ctx)
	var out volume.Found
	pods, err := p.rfs.ReadDir("pods")
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			logger.Error(err, "Cannot list the pod directories: no nfs volume is reconstructed")
		}
		return out
	}
	for _, pe := range pods {
		if !pe.IsDir() || fsutil.ValidateName("pod UID", pe.Name()) != nil {
			continue // not a pod directory; a symlink is not followed
		}
		uid := types.UID(pe.Name())
		rel := path.Join("pods", pe.Name(), "volumes", escapedName)
		entries, err := p.rfs.ReadDir(rel)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue
		case err != nil:
			logger.Error(err, "Cannot list the pod's nfs volumes, leaving them alone", "podUID", uid)
			out.Attempted++
			out.Unreadable = append(out.Unreadable, filepath.Join(p.root, rel))
			continue
		}
		for _, e := range entries {
			out.Attempted++
			abs := filepath.Join(p.root, rel, e.Name())
			if !e.IsDir() || fsutil.ValidateName("volume name", e.Name()) != nil {
				logger.Info("Found no directory where an nfs volume is expected, leaving it alone", "path", abs, "type", e.Type().String())
				out.Unreadable = append(out.Unreadable, abs)
				continue
			}
			state := cache.Uncertain
			if rc.MountPoints[abs] {
				state = cache.Mounted
			}
			out.Mounts = append(out.Mounts, volume.FoundMount{
				Spec:   cache.VolumeSpec{Name: volumeName(uid, e.Name()), Plugin: PluginName, Mode: cache.Filesystem, Ephemeral: true},
				Volume: cache.PodVolume{Pod: cache.PodRef{UID: uid}, SpecName: e.Name()},
				Path:   abs, State: state,
			})
			logger.V(2).Info("Reconstructed nfs volume", "podUID", uid, "volume", e.Name(), "path", abs, "state", state)
		}
	}
	return out
}

// Retake implements volume.Reconstructor: dir, found unreadable at start,
// is removed only when it is an empty directory (never a file) below the root that the
// mount table (mounted) does not list as a mount point; it reports
// whether it is gone.
func (p *plugin) Retake(ctx context.Context, dir string, mounted map[string]bool) bool {
	if mounted == nil || mounted[dir] {
		return false
	}
	if _, err := p.rfs.Rel(dir); err != nil {
		return false
	}
	if fi, err := p.rfs.Lstat(dir); err != nil || !fi.IsDir() {
		return false // what is not a directory is not the plugin's to remove
	}
	if err := p.rfs.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false
	}
	klog.FromContext(ctx).Info("Removed an nfs volume directory found unreadable at start", "path", dir)
	return true
}
