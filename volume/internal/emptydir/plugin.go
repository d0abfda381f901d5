// Package emptydir is the emptyDir plugin's implementation, behind the
// small public package volume/emptydir (whose doc says what the plugin
// does), and the wrapper (Wrapper) in which the configMap, secret,
// downwardAPI and projected plugins keep their volumes' content, as the
// kubelet's wrapped emptyDir does.
package emptydir

import (
	"errors"
	"fmt"
	"path"
	"path/filepath"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/internal/fsgroup"
	"github.com/nodevol/nodevol/internal/fsutil"
	"github.com/nodevol/nodevol/internal/rootfs"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/step"
	"github.com/nodevol/nodevol/volume"
)

// PluginName is the plugin's name, the kubelet's.
const PluginName = "kubernetes.io/empty-dir"

// escapedName is the plugin's name as a path component, the kubelet's.
const escapedName = "kubernetes.io~empty-dir"

// readyFile is the name of the kubelet's ready file.
const readyFile = "ready"

// Modes of what SetUp creates: the volume directory is the kubelet's 0777
// (chmodded against the umask); the directories above it and the ready
// directory are nodevol's usual 0750, the ready file 0644.
const (
	volumeDirMode = 0o777
	parentDirMode = 0o750
	readyFileMode = 0o644
)

// Config configures the plugin. It is volume/emptydir.Config, which
// converts to it field for field and documents each field; the two are
// kept identical by that conversion, which does not compile otherwise.
type Config struct {
	RootDir           string
	Mounter           mount.Interface
	Steps             step.Hook
	AllocatableMemory func() (int64, error)
}

// plugin is the emptyDir plugin.
type plugin struct {
	// name is the plugin's name, escaped its volumes' directory under a
	// pod's volumes/; wrapped: the volumes are another plugin's, whose
	// ready files are those of an emptyDir named wrapped_{name} (Wrapper).
	name, escaped string
	// title names the volumes' kind in logs ("emptyDir", or the wrapping
	// plugin's: "configMap").
	title   string
	wrapped bool
	root    string
	rfs     *rootfs.Root
	mounter mount.Interface
	steps   step.Hook
	alloc   func() (int64, error)
	// noswap reports whether a tmpfs is mounted with noswap.
	noswap func() bool
	// mountRootsKnown reports whether the kernel says which directories
	// are mount roots (see mountRootsKnown in mounts.go).
	mountRootsKnown func() bool
	// ownership changes a volume's group to the pod's fsGroup.
	ownership fsgroup.Reporter
	// tables shares the mount table reads of concurrent calls (shared
	// by the copies withRootHeld makes).
	tables *tableReads
}

var (
	_ volume.Plugin        = (*plugin)(nil)
	_ volume.SpecResolver  = (*plugin)(nil)
	_ volume.StatsProvider = (*plugin)(nil)
	_ volume.Reconstructor = (*plugin)(nil)
)

// New returns the emptyDir plugin.
func New(cfg Config) (volume.Plugin, error) {
	return newPlugin(cfg)
}

func newPlugin(cfg Config) (*plugin, error) {
	if cfg.RootDir == "" {
		return nil, errors.New("emptyDir plugin: RootDir is required")
	}
	if cfg.Mounter == nil {
		return nil, errors.New("emptyDir plugin: Mounter is required")
	}
	r, err := rootfs.New(cfg.RootDir)
	if err != nil {
		return nil, fmt.Errorf("emptyDir plugin: %w", err)
	}
	return &plugin{
		name:    PluginName,
		escaped: escapedName,
		title:   "emptyDir",
		root:    r.Path(),
		rfs:     r.WithSteps(cfg.Steps),
		mounter: step.Mounter(cfg.Mounter, cfg.Steps),
		steps:   cfg.Steps,
		alloc:   cfg.AllocatableMemory,
		noswap:  tmpfsNoswapSupported,

		mountRootsKnown: mountRootsKnown,
		tables:          &tableReads{},
	}, nil
}

// withRootHeld returns a copy of p whose root resolves every name from one handle
// on the root directory, opened now, and the function that closes it: for
// the file-system work of one set-up or teardown, which thus opens the
// root once instead of once a call. A file system mounted on the root
// later is seen by the next one (rootfs.Root.Hold). A root that does not
// exist yet is not held: p itself is returned, whose calls make it as
// needed.
func (p *plugin) withRootHeld() (*plugin, func(), error) {
	h, release, err := p.rfs.HoldIfPresent()
	if err != nil {
		return nil, nil, err
	}
	q := *p
	q.rfs = h
	return &q, release, nil
}

// Name implements volume.Plugin.
func (p *plugin) Name() string { return p.name }

// CanSupport implements volume.Plugin: pod volumes with an emptyDir source.
func (p *plugin) CanSupport(v *v1.Volume) bool { return v != nil && v.EmptyDir != nil }

// Capabilities implements volume.Plugin: an emptyDir is neither attached
// nor staged, never a block device, never published again; the kubelet
// gives the pod's fsGroup ownership of it. Its sizeLimit, when positive,
// is its SizeLimit (the kubelet evicts a pod whose emptyDir's usage
// exceeds it; one of zero is no limit there either).
func (p *plugin) Capabilities(spec *podvol.VolumeSpec) (volume.Capabilities, error) {
	caps := volume.Capabilities{OwnershipChange: true}
	if spec != nil && spec.Source != nil && spec.Source.EmptyDir != nil {
		if l := spec.Source.EmptyDir.SizeLimit; l != nil && l.Sign() > 0 {
			caps.SizeLimit = l
		}
	}
	return caps, nil
}

// volumeName is the unique name of pod's volume specName, the kubelet's
// for a pod-scoped volume.
func (p *plugin) volumeName(pod types.UID, specName string) podvol.UniqueVolumeName {
	return podvol.UniqueVolumeName(p.name + "/" + string(pod) + "-" + specName)
}

// paths are one volume's places on disk, relative to the root.
type paths struct {
	// dir is the volume directory, readyDir the directory of its ready
	// file; abs is dir's absolute path.
	dir, readyDir, abs string
}

func (p paths) ready() string { return path.Join(p.readyDir, readyFile) }

// volumePaths returns the paths of pod uid's volume specName, both names
// checked to be one path component each.
func (p *plugin) volumePaths(uid types.UID, specName string) (paths, error) {
	if err := fsutil.ValidateName("pod UID", string(uid)); err != nil {
		return paths{}, err
	}
	if err := fsutil.ValidateName("volume name", specName); err != nil {
		return paths{}, err
	}
	pod := path.Join("pods", string(uid))
	dir := path.Join(pod, "volumes", p.escaped, specName)
	ready := path.Join(pod, "plugins", escapedName, specName)
	if p.wrapped {
		ready = path.Join(pod, "plugins", escapedName, wrappedPrefix+specName)
	}
	return paths{
		dir:      dir,
		readyDir: ready,
		abs:      filepath.Join(p.root, dir),
	}, nil
}
