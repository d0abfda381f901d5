package objvolume

import (
	"context"
	"errors"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/cache"
	"github.com/nodevol/nodevol/internal/atomicwriter"
	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/internal/rootfs"
	"github.com/nodevol/nodevol/util/step"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/emptydir"
)

// Objects is what a plugin reads its objects from: the node's object
// cache (objectcache.Cache), whose Get waits for the first read of a held
// Ref and answers apierrors.IsNotFound for a missing object.
type Objects interface {
	Get(ctx context.Context, ref objectcache.Ref) (runtime.Object, error)
}

// Source is what a pod volume's source says of its object and files.
type Source struct {
	// Name is the object's name, in the pod's namespace.
	Name string
	// Items, DefaultMode and Optional are the source's fields.
	Items       []v1.KeyToPath
	DefaultMode *int32
	Optional    *bool
}

// Kind is what differs between the plugins of this package's shape.
type Kind struct {
	// Name is the plugin's name ("kubernetes.io/secret").
	Name string
	// Title names the plugin's volumes in messages ("secret").
	Title string
	// Object is the kind of object read; Resource is how the kubelet
	// names it in its not-found error ("secret": `secret "x" not found`).
	Object   objectcache.Kind
	Resource string
	// Memory: the volume is a tmpfs (the wrapped emptyDir of medium
	// Memory), never on disk.
	Memory bool
	// DefaultMode is the mode the API server defaults the source's
	// defaultMode to, used when a pod that skipped defaulting has none.
	DefaultMode int32
	// Source returns the source of vs; ok is false when vs is not of
	// this kind.
	Source func(vs *v1.VolumeSource) (src Source, ok bool)
	// Payload returns the files of obj (nil: a missing optional object)
	// with the kubelet's MakePayload, and its error texts.
	Payload func(obj runtime.Object, it atomicwriter.Items) (map[string]atomicwriter.File, error)
}

// Config is a plugin's configuration: the fields of the configmap and
// secret packages' Configs.
type Config struct {
	RootDir           string
	Mounter           mount.Interface
	Steps             step.Hook
	AllocatableMemory func() (int64, error)
	Objects           Objects
}

// Plugin is a plugin of Kind's shape.
type Plugin struct {
	kind    Kind
	wrapper *emptydir.Wrapper
	root    *rootfs.Root
	steps   step.Hook
	objects Objects
}

var (
	_ volume.Plugin        = (*Plugin)(nil)
	_ volume.SpecResolver  = (*Plugin)(nil)
	_ volume.Reconstructor = (*Plugin)(nil)
)

// New returns the plugin of kind k.
func New(k Kind, cfg Config) (*Plugin, error) {
	if cfg.Objects == nil {
		return nil, fmt.Errorf("%s plugin: Objects is required", k.Title)
	}
	w, err := emptydir.NewWrapper(emptydir.Config{
		RootDir: cfg.RootDir, Mounter: cfg.Mounter, Steps: cfg.Steps, AllocatableMemory: cfg.AllocatableMemory,
	}, k.Name)
	if err != nil {
		return nil, fmt.Errorf("%s plugin: %w", k.Title, err)
	}
	root, err := rootfs.New(cfg.RootDir)
	if err != nil {
		return nil, fmt.Errorf("%s plugin: %w", k.Title, err)
	}
	return &Plugin{kind: k, wrapper: w, root: root, steps: cfg.Steps, objects: cfg.Objects}, nil
}

// Name implements volume.Plugin.
func (p *Plugin) Name() string { return p.kind.Name }

// CanSupport implements volume.Plugin: pod volumes with a source of the
// plugin's kind.
func (p *Plugin) CanSupport(v *v1.Volume) bool {
	if v == nil {
		return false
	}
	_, ok := p.kind.Source(&v.VolumeSource)
	return ok
}

// Capabilities implements volume.Plugin: neither attached nor staged,
// never a block device; published again at each resync and each change of
// the object (the kubelet remounts these volumes at every pod sync). The
// pod's fsGroup is applied by the writer whatever the planner decides
// (the kubelet applies it to these volumes read-only or not), so no
// ownership change is asked for.
func (p *Plugin) Capabilities(*cache.VolumeSpec) (volume.Capabilities, error) {
	return volume.Capabilities{Republish: true, ReadOnly: true}, nil
}

// Reconstruct implements volume.Reconstructor: the Wrapper's. Every
// volume found is Uncertain, a tmpfs still mounted with its ready file
// too (a process stopped in a Write left its files missing or
// half-linked), so that SetUp writes it again, or confirms it, for a
// running pod before the volume is reported mounted.
func (p *Plugin) Reconstruct(ctx context.Context, rc volume.Recovery) volume.Found {
	return p.wrapper.Reconstruct(ctx, rc)
}

// Retake implements volume.Reconstructor: the Wrapper's.
func (p *Plugin) Retake(ctx context.Context, dir string, mounted map[string]bool) bool {
	return p.wrapper.Retake(ctx, dir, mounted)
}

// TearDown implements volume.Mounter: the Wrapper's, from the pod's UID
// and the volume's name alone (the spec's source may be nil). Idempotent.
func (p *Plugin) TearDown(ctx context.Context, req volume.MountRequest) error {
	return p.wrapper.TearDown(ctx, req.Volume.Pod.UID, req.Volume.SpecName)
}

// source returns spec's source, with its defaultMode defaulted.
func (p *Plugin) source(spec *cache.VolumeSpec) (Source, error) {
	if spec == nil || spec.Source == nil {
		return Source{}, fmt.Errorf("the spec has no %s source", p.kind.Title)
	}
	src, ok := p.kind.Source(spec.Source)
	if !ok {
		return Source{}, fmt.Errorf("the spec has no %s source", p.kind.Title)
	}
	if src.DefaultMode == nil {
		mode := p.kind.DefaultMode
		src.DefaultMode = &mode
	}
	return src, nil
}

// errNotResolved is the error of a spec ResolveSpec did not see.
var errNotResolved = errors.New("the spec was not resolved for its pod (no tmpfs size)")
