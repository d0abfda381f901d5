// Package emptydir is the volume plugin of emptyDir pod volumes
// ("kubernetes.io/empty-dir"): the pod's scratch space, created empty when
// the pod's volume is set up and deleted with everything in it when it is
// torn down.
//
// It does what the kubelet v1.37's emptyDir plugin does, on the kubelet's
// layout, so that a node can pass between the kubelet and nodevol:
//
//   - the volume is the directory
//     {root}/pods/{uid}/volumes/kubernetes.io~empty-dir/{name}, mode 0777
//     whatever the umask; medium Memory mounts a tmpfs there, sized as the
//     kubelet sizes it (the smallest of the volume's sizeLimit, the pod's
//     memory limit and the node's allocatable memory), with noswap where
//     the kernel has it; the hugepages media mount a hugetlbfs with the
//     page size the pod's hugepage resources give;
//   - SetUp writes the kubelet's ready file,
//     {root}/pods/{uid}/plugins/kubernetes.io~empty-dir/{name}/ready, once
//     the volume is set up, and is a no-op when it is there and the volume
//     is whole (a disk volume's directory exists, a memory volume's tmpfs
//     is mounted): a Memory volume found after a reboot, ready file and no
//     tmpfs, is mounted again;
//   - fsGroup ownership, when the volume manager asks for it;
//   - TearDown removes the ready file, unmounts the tmpfs or hugetlbfs and
//     deletes the directory with everything in it;
//   - VolumeStats measures usage and inodes with a du-style walk, as the
//     kubelet's metrics provider does for every medium, and capacity from
//     statfs, for the caller's eviction;
//   - Reconstruct finds the volumes earlier runs (or the kubelet) left.
//
// Everything below the root is reached without following a symlink
// (internal/rootfs), and TearDown's deletion neither follows a symlink the
// pod planted in its volume (the link goes, its target stays) nor enters
// another mount below the volume: it refuses, naming the mount, rather
// than delete another file system's data.
//
// What the kubelet does and this plugin does not: project quotas on the
// volume (LocalStorageCapacityIsolationFSQuotaMonitoring) and usage read
// from them, the alpha EmptyDirVolumeMode (emptyDir.mode), resizing a
// memory volume's tmpfs when the pod is resized, and the kubelet's test
// mount for noswap on kernels older than 6.4 (noswap is used from 6.4 on
// and outside a user namespace, as the kubelet decides it, and left out
// otherwise).
//
// ResolveSpec stores what SetUp needs from the pod in the spec's
// Attributes, read by this plugin only:
//
//   - "medium": the volume's medium as the pod gives it ("", "Memory",
//     "HugePages", "HugePages-<size>"), checked; its presence marks a
//     resolved spec;
//   - "sizeBytes": for medium Memory, the tmpfs size in bytes (decimal);
//     absent when nothing bounds it (the tmpfs then gets the kernel's
//     default, half the node's memory);
//   - "pageSize": for a hugepages medium, the page size of the hugetlbfs
//     mount option pagesize=, as the kubelet spells it ("2Mi").
package emptydir

import (
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/step"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/internal/emptydir"
)

// PluginName is the plugin's name, the kubelet's.
const PluginName = emptydir.PluginName

// Config configures the plugin.
type Config struct {
	// RootDir is the kubelet's root directory (/var/lib/kubelet): pods/
	// lives under it. Required.
	RootDir string
	// Mounter mounts and unmounts the tmpfs and hugetlbfs of memory and
	// hugepages volumes and lists the mount table. Required
	// (mount.NewFakeMounter in unit tests).
	Mounter mount.Interface
	// Steps, if set, sees every change the plugin makes to the node
	// (directories, files, mounts) before it is made (package step).
	// Default: none.
	Steps step.Hook
	// AllocatableMemory returns the node's allocatable memory in bytes,
	// the caller's figure: an upper bound of a memory volume's size. Nil,
	// an error or a figure that is not positive: it is not used as a
	// bound.
	AllocatableMemory func() (int64, error)
}

// New returns the emptyDir plugin. It fails when RootDir or Mounter is
// missing.
func New(cfg Config) (volume.Plugin, error) {
	return emptydir.New(emptydir.Config(cfg))
}
