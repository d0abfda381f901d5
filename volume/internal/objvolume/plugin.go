package objvolume

import (
	"context"
	"errors"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/internal/atomicwriter"
	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/step"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/internal/emptydir"
	"github.com/nodevol/nodevol/volume/internal/wrapped"
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
	// RootDir is the kubelet's root directory (/var/lib/kubelet): pods/
	// lives under it. Required.
	RootDir string
	// Mounter mounts and unmounts the volumes' tmpfs and lists the mount
	// table. Required (mount.NewFakeMounter in unit tests).
	Mounter mount.Interface
	// Steps, if set, sees every change the plugin makes to the node
	// (directories, files, mounts) before it is made (package step).
	// Default: none.
	Steps step.Hook
	// AllocatableMemory returns the node's allocatable memory in bytes:
	// an upper bound of a volume's tmpfs. Nil, an error or a figure that
	// is not positive: not used as a bound.
	AllocatableMemory func() (int64, error)
	// Objects reads the objects; the caller holds the Refs of each pod
	// before its volumes are set up. Required.
	Objects Objects
}

// Plugin is a plugin of Kind's shape; the wrapped emptyDir gives it its
// Capabilities, TearDown, Reconstruct, Retake and VolumeStats.
type Plugin struct {
	wrapped.Base
	kind    Kind
	objects Objects
}

var (
	_ volume.Plugin        = (*Plugin)(nil)
	_ volume.SpecResolver  = (*Plugin)(nil)
	_ volume.Reconstructor = (*Plugin)(nil)
	_ volume.StatsProvider = (*Plugin)(nil)
	_ volume.ObjectReader  = (*Plugin)(nil)
)

// New returns the plugin of kind k.
func New(k Kind, cfg Config) (*Plugin, error) {
	if cfg.Objects == nil {
		return nil, fmt.Errorf("%s plugin: Objects is required", k.Title)
	}
	b, err := wrapped.New(k.Title, k.Name, emptydir.Config{
		RootDir: cfg.RootDir, Mounter: cfg.Mounter, Steps: cfg.Steps, AllocatableMemory: cfg.AllocatableMemory,
	}, nil)
	if err != nil {
		return nil, err
	}
	return &Plugin{Base: b, kind: k, objects: cfg.Objects}, nil
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

// Objects implements volume.ObjectReader: the object of a pod volume of
// the plugin's kind (Refs).
func (p *Plugin) Objects(namespace string, v *v1.Volume) []objectcache.Ref {
	return Refs(p.kind, namespace, &v.VolumeSource)
}

// Refs returns the object a volume source of kind k of a pod in namespace
// ns reads: the one it names, held whether or not the source is optional
// (an optional object that appears later fills the volume). None for a
// source of another kind or one that names nothing.
func Refs(k Kind, ns string, vs *v1.VolumeSource) []objectcache.Ref {
	src, ok := k.Source(vs)
	if !ok || src.Name == "" {
		return nil
	}
	return []objectcache.Ref{{Kind: k.Object, Namespace: ns, Name: src.Name}}
}

// source returns spec's source, with its defaultMode defaulted.
func (p *Plugin) source(spec *podvol.VolumeSpec) (Source, error) {
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
