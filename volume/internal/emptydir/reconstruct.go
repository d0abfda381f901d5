package emptydir

import (
	"context"
	"io/fs"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/internal/podscan"
)

// Reconstruct implements volume.Reconstructor: it returns the emptyDir
// volumes earlier runs (nodevol's or the kubelet's) left, every directory
// {root}/pods/{uid}/volumes/kubernetes.io~empty-dir/{name}, with the spec
// the volume manager gives a pod's emptyDir. The medium cannot be known
// after a restart, so a volume is Mounted only when its ready file is
// there and its directory is a mount point (rc.MountPoints): a memory or
// hugepages volume whose file system is still mounted. Any other is
// Uncertain: SetUp, run again for a pod that still wants it, finds a disk
// volume ready and mounts a memory volume's tmpfs again (after a reboot);
// TearDown deletes it for a pod that is gone. A wrapped volume (Wrapper)
// is always Uncertain. Nothing is removed here.
//
// It follows no symlink below the root: a symlink or a file where a
// volume directory is expected, and a directory that cannot be listed,
// are logged and listed as unreadable.
func (p *plugin) Reconstruct(ctx context.Context, rc volume.Recovery) volume.Found {
	logger := klog.FromContext(ctx)
	return podscan.Scan(logger, p.rfs, p.root, p.escaped, p.title, func(uid types.UID, e fs.DirEntry, _ string) (volume.FoundMount, bool) {
		return p.found(logger, rc, uid, e)
	})
}

// found reconstructs pod uid's volume directory entry e; ok is false
// (logged) when it is not a directory nodevol can take down.
func (p *plugin) found(logger klog.Logger, rc volume.Recovery, uid types.UID, e fs.DirEntry) (volume.FoundMount, bool) {
	at, err := p.volumePaths(uid, e.Name())
	if err != nil {
		logger.Error(err, "Cannot reconstruct a volume, leaving it alone", "kind", p.title, "podUID", uid)
		return volume.FoundMount{}, false
	}
	if !e.IsDir() {
		logger.Info("Found no directory where a volume is expected, leaving it alone", "kind", p.title, "path", at.abs, "type", e.Type().String())
		return volume.FoundMount{}, false
	}
	state := podvol.Uncertain
	// A wrapped volume is never Mounted here: its files are the wrapping
	// plugin's, written after the ready file and the tmpfs, and a process
	// stopped in between leaves them missing or half-linked. Uncertain
	// makes the volume manager run that plugin's SetUp (which completes
	// or confirms them) before it reports the volume mounted, as the
	// kubelet remounts these volumes at a pod's first sync after a start.
	if p.isReady(at) && rc.MountPoints[at.abs] && !p.wrapped {
		state = podvol.Mounted
	}
	spec := podvol.VolumeSpec{Name: p.volumeName(uid, e.Name()), Plugin: p.name, Mode: podvol.Filesystem, Ephemeral: true}
	vol := podvol.PodVolume{Pod: podvol.PodRef{UID: uid}, SpecName: e.Name()}
	logger.V(2).Info("Reconstructed volume", "kind", p.title, "podUID", uid, "volume", spec.Name, "path", at.abs, "state", state)
	return volume.FoundMount{Spec: spec, Volume: vol, Path: at.abs, State: state}, true
}

// Retake implements volume.Reconstructor: it removes dir, found unreadable
// at start, only when it is an emptyDir volume directory (absolute, as
// Reconstruct lists them) that is a plain directory, empty and not a
// mount point in mounted, with its ready file; it reports whether it did.
// Every other directory (another plugin's, a symlink, one that holds
// anything) stays, and false is returned.
func (p *plugin) Retake(ctx context.Context, dir string, mounted map[string]bool) bool {
	rel, err := p.rfs.Rel(dir)
	if err != nil {
		return false
	}
	parts := strings.Split(rel, "/")
	if len(parts) != 5 || parts[0] != "pods" || parts[2] != "volumes" || parts[3] != p.escaped {
		return false
	}
	at, err := p.volumePaths(types.UID(parts[1]), parts[4])
	if err != nil || mounted[at.abs] {
		return false
	}
	if fi, err := p.rfs.Lstat(at.dir); err != nil || !fi.IsDir() {
		return false
	}
	if entries, err := p.rfs.ReadDir(at.dir); err != nil || len(entries) > 0 {
		return false
	}
	if err := p.rfs.RemoveIn(at.readyDir, readyFile); err != nil {
		return false
	}
	if err := p.rfs.Remove(at.dir); err != nil {
		return false
	}
	klog.FromContext(ctx).Info("Removed an empty volume directory found unreadable at start", "kind", p.title, "path", at.abs)
	return true
}
