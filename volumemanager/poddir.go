package volumemanager

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/internal/poddir"
	"github.com/nodevol/nodevol/internal/rootfs"
)

// ErrPodDirInUse is wrapped by CleanupPodDir's refusal to touch the
// directory of a pod that is not gone for the manager: it was added and
// not deleted, a volume of it is mounted or may be, or the volumes an
// earlier run left on disk are not all known yet. Try again later.
var ErrPodDirInUse = errors.New("the pod's directory may still be in use")

// PodDirKeptError is CleanupPodDir's error when the pod's directory stays:
// it names each thing kept and why (ErrPodDirMountPoint, ErrPodDirNotOurs,
// or the error of a removal).
type PodDirKeptError = poddir.KeptError

var (
	// ErrPodDirMountPoint is the reason for a mount point CleanupPodDir
	// kept: neither entered nor removed.
	ErrPodDirMountPoint = poddir.ErrMountPoint
	// ErrPodDirNotOurs is the reason for a file CleanupPodDir kept: not a
	// file nodevol or the kubelet writes there, so it may hold data.
	ErrPodDirNotOurs = poddir.ErrNotOurs
)

// CleanupPodDir removes the directory {RootDir}/pods/{uid} of a pod that
// is gone (deleted, and WaitForUnmount has returned), as the kubelet's
// housekeeping removes an orphaned pod's directory: the empty directories
// its volumes and containers leave, symlinks (as links, never followed),
// and the files nodevol or the kubelet write there (etc-hosts, termination
// message files, emptyDir ready files, empty subPath targets). A mount
// point anywhere in it makes it refuse before it removes anything, and the
// mount is left as it is; anything else (a file left in a volume
// directory, say) is kept with the directories above it. Then the error
// is a *PodDirKeptError naming each thing kept and why.
//
// It refuses (ErrPodDirInUse), touching nothing, while the pod is added
// and not deleted, while any volume of the pod is mounted or may be
// (HasPossiblyMountedVolumesForPod), and until Run has taken in what an
// earlier run left on disk (ReconcilerStatesHasBeenSynced). A missing
// directory is not an error. No symlink below the root is followed. The
// node's mount table is read once per call, for mounts the kernel does not
// mark (before Linux 5.8) and those of a fake mounter.
func (vm *VolumeManager) CleanupPodDir(ctx context.Context, uid types.UID) error {
	if err := vm.podDirInUse(uid); err != nil {
		return fmt.Errorf("volumemanager: not removing the directory of pod %s: %w", uid, err)
	}
	root, err := rootfs.New(vm.cfg.RootDir)
	if err != nil {
		return fmt.Errorf("volumemanager: removing the directory of pod %s: %w", uid, err)
	}
	mps, err := vm.cfg.Mounter.List()
	if err != nil {
		return fmt.Errorf("volumemanager: removing the directory of pod %s: listing mount points: %w", uid, err)
	}
	table := make(map[string]bool, len(mps))
	for _, mp := range mps {
		table[mp.Path] = true
	}
	err = poddir.Remove(ctx, poddir.Request{
		Root:         root.WithSteps(vm.cfg.Steps),
		Pod:          uid,
		IsMountPoint: func(p string) bool { return table[p] },
	})
	if err != nil {
		return fmt.Errorf("volumemanager: removing the directory of pod %s: %w", uid, err)
	}
	klog.FromContext(ctx).V(4).Info("Pod directory removed", "podUID", uid)
	return nil
}

// podDirInUse says why the pod's directory may still be in use, or nil.
func (vm *VolumeManager) podDirInUse(uid types.UID) error {
	switch {
	case !vm.statesSynced.Load():
		return fmt.Errorf("%w: the volumes on disk are not all known yet (Run has not taken them in)", ErrPodDirInUse)
	case vm.in.Knows(uid):
		return fmt.Errorf("%w: the pod was added and not deleted", ErrPodDirInUse)
	}
	if vols := vm.asw.PodVolumes(uid); len(vols) > 0 {
		names := make([]string, 0, len(vols))
		for _, v := range vols {
			names = append(names, v.SpecName)
		}
		sort.Strings(names)
		return fmt.Errorf("%w: volumes %q are mounted or may be", ErrPodDirInUse, names)
	}
	return nil
}
