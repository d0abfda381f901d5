// Package downwardapi is the volume plugin of downwardAPI pod volumes
// ("kubernetes.io/downward-api"): files that show the pod its own
// metadata (name, namespace, UID, labels, annotations) and its containers'
// resources, kept current when the pod's labels or annotations change.
//
// It does what the kubelet v1.37's downwardAPI plugin does, on the
// kubelet's layout, so that a node can pass between the kubelet and
// nodevol:
//
//   - the volume is {root}/pods/{uid}/volumes/kubernetes.io~downward-api/{name},
//     a tmpfs (the kubelet wraps an emptyDir of medium Memory), sized as
//     the kubelet sizes it (the pod's memory limit, the node's allocatable
//     memory), with the ready file of an emptyDir named wrapped_{name}
//     (emptydir.Wrapper);
//   - the files are those of the kubelet's CollectData (internal/downward:
//     field paths, label and annotation formats, resources with divisor
//     and the node's allocatable for a limit a container does not declare,
//     modes, its error texts; a source without defaultMode, from a pod
//     built in Go, gets the API server's 0644 where the kubelet would
//     fail), written by the kubelet's atomic writer
//     (internal/atomicwriter: ..data and the timestamped directories, the
//     pod's fsGroup given to every file, whatever the planner's
//     ChangeOwnership, as the kubelet always applies it here);
//   - the volume is published again at every resync (Republish) and a
//     write that changes nothing changes nothing;
//   - TearDown and Reconstruct are the wrapped emptyDir's.
//
// ResolveSpec computes the files from the pod, so that SetUp needs no pod
// and a change of the pod's labels or annotations (or of the node's
// allocatable resources, when an item reads a limit the container does
// not declare) is a change of the spec, which the volume manager
// publishes again. It stores in spec.Attributes, read by this plugin only:
//
//   - "resolved": "true", marking a resolved spec (a volume with no items
//     has no other attribute);
//   - "sizeBytes": the tmpfs size in bytes (decimal), absent when nothing
//     bounds it;
//   - "file:{path}": the content of the file at path (the cleaned item
//     path), one attribute per file;
//   - "mode:{path}": its permission bits, in octal ("644");
//   - "user:{path}": its owner's UID (decimal), only with the alpha
//     AtomicWriteVolumeUserFields (Config.UserFields) and a user set.
//
// What the kubelet does and this plugin does not: the directories it makes
// in the volume for other volumes that a container mounts beneath this
// one (MakeNestedMountpoints); tearing the volume down when a write fails
// (the old content stays here, as for the other kinds); reading the node's
// allocatable resources afresh at every sync (here at each resolution of
// the pod: the volume manager resolves the pod again when they change).
//
// Usage (VolumeStats) is the kubelet's: a du walk of the volume, kept until
// the volume is written again (at each resync or change of the pod).
package downwardapi

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/step"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/internal/emptydir"
	"github.com/nodevol/nodevol/volume/internal/wrapped"
)

// PluginName is the plugin's name, the kubelet's.
const PluginName = "kubernetes.io/downward-api"

// Config configures the plugin.
type Config struct {
	// RootDir is the kubelet's root directory (/var/lib/kubelet): pods/
	// lives under it. Required.
	RootDir string
	// Mounter mounts and unmounts the volumes' tmpfs and lists the mount
	// table. Required (mount.NewFakeMounter in unit tests).
	Mounter mount.Interface
	// Steps, if set, sees every change the plugin makes to the node
	// (directories, files, links, mounts) before it is made (package
	// step). Default: none.
	Steps step.Hook
	// NodeAllocatable returns the node's allocatable resources
	// (node.status.allocatable): the limits of cpu, memory and
	// ephemeral-storage of a container that declares none, which an item
	// may read, and the bound of the tmpfs size. It is called when a pod
	// is resolved. Nil: no such limit is known (it reads 0) and the tmpfs
	// is bounded by the pod alone. An error fails the resolution of the
	// pod's volume (wrapping volume.ErrNotReady: the pod spec is not at
	// fault), as the kubelet fails the mount when it cannot read its node.
	NodeAllocatable func() (v1.ResourceList, error)
	// UserFields turns on the user fields (defaultUser, items[].user) of
	// the AtomicWriteVolumeUserFields feature (alpha in 1.37, off by
	// default, as in the kubelet): the files then get those owners.
	UserFields bool
}

// plugin is the downwardAPI plugin; the wrapped emptyDir gives it its
// Capabilities, TearDown, Reconstruct, Retake and VolumeStats.
type plugin struct {
	wrapped.Base
	userFields bool
}

var (
	_ volume.Plugin        = (*plugin)(nil)
	_ volume.SpecResolver  = (*plugin)(nil)
	_ volume.Reconstructor = (*plugin)(nil)
	_ volume.StatsProvider = (*plugin)(nil)
)

// New returns the downwardAPI plugin.
func New(cfg Config) (volume.Plugin, error) {
	return newPlugin(cfg)
}

func newPlugin(cfg Config) (*plugin, error) {
	b, err := wrapped.New("downwardAPI", PluginName, emptydir.Config{RootDir: cfg.RootDir, Mounter: cfg.Mounter, Steps: cfg.Steps},
		cfg.NodeAllocatable)
	if err != nil {
		return nil, err
	}
	return &plugin{Base: b, userFields: cfg.UserFields}, nil
}

// Name implements volume.Plugin.
func (p *plugin) Name() string { return PluginName }

// CanSupport implements volume.Plugin: pod volumes with a downwardAPI
// source.
func (p *plugin) CanSupport(v *v1.Volume) bool { return v != nil && v.DownwardAPI != nil }
