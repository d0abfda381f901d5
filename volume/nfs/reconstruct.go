package nfs

import (
	"context"
	"io/fs"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/internal/fsutil"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/internal/podscan"
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
	return podscan.Scan(logger, p.rfs, p.root, escapedName, "nfs", func(uid types.UID, e fs.DirEntry, abs string) (volume.FoundMount, bool) {
		if !e.IsDir() || fsutil.ValidateName("pod UID", string(uid)) != nil || fsutil.ValidateName("volume name", e.Name()) != nil {
			logger.Info("Found no directory where an nfs volume is expected, leaving it alone", "path", abs, "type", e.Type().String())
			return volume.FoundMount{}, false
		}
		state := podvol.Uncertain
		if rc.MountPoints[abs] {
			state = podvol.Mounted
		}
		logger.V(2).Info("Reconstructed nfs volume", "podUID", uid, "volume", e.Name(), "path", abs, "state", state)
		return volume.FoundMount{
			Spec:   podvol.VolumeSpec{Name: volumeName(uid, e.Name()), Plugin: PluginName, Mode: podvol.Filesystem, Ephemeral: true},
			Volume: podvol.PodVolume{Pod: podvol.PodRef{UID: uid}, SpecName: e.Name()},
			Path:   abs, State: state,
		}, true
	})
}

// Retake implements volume.Reconstructor: dir, found unreadable at start,
// is removed only when it is an empty directory (never a file) below the
// root that the mount table (mounted) does not list as a mount point; it
// reports whether it is gone.
func (p *plugin) Retake(ctx context.Context, dir string, mounted map[string]bool) bool {
	return podscan.RemoveEmptyDir(ctx, p.rfs, dir, mounted, "nfs")
}
