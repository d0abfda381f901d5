// Package wrapped is what the plugins whose volumes are a wrapped emptyDir
// filled by the atomic writer share: configMap and secret (through
// objvolume), downwardAPI and projected. The kubelet's four plugins wrap an
// emptyDir the same way; here Base holds that wrapped emptyDir, the root
// the writer writes below and the steps hook, and gives the plugin that
// embeds it its Capabilities, TearDown, Reconstruct, Retake and
// VolumeStats (the volume's usage, measured with a du walk and kept until
// the volume is written again, as the kubelet caches these kinds' usage).
//
// It also holds the node's allocatable resources, which bound the tmpfs
// (their memory) and which a downward API item reads for a limit a
// container does not declare (NodeAllocatable). What a plugin stores in
// spec.Attributes and how it makes its files stay the plugin's own.
package wrapped

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/internal/atomicwriter"
	"github.com/nodevol/nodevol/internal/downward"
	"github.com/nodevol/nodevol/internal/rootfs"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/step"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/internal/du"
	"github.com/nodevol/nodevol/volume/internal/emptydir"
)

// Base is the part of a plugin that the wrapped emptyDir does; a plugin
// embeds it.
type Base struct {
	// Wrapper sets the volumes' directories up and takes them down.
	Wrapper *emptydir.Wrapper
	// Root is the root directory, without the steps hook: the atomic
	// writer adds it.
	Root *rootfs.Root
	// Steps is the plugin's steps hook, for the writer.
	Steps step.Hook
	alloc func() (v1.ResourceList, error)
	// title names the plugin in errors ("downwardAPI").
	title string
	// usage keeps each volume's measurement until it is written again.
	usage *du.Cache
}

// New returns the Base of plugin pluginName; title names the plugin in
// its errors ("downwardAPI"). cfg is the wrapped emptyDir's; its
// AllocatableMemory, if nil, is the memory of node. node returns the
// node's allocatable resources; nil: they are not known.
func New(title, pluginName string, cfg emptydir.Config, node func() (v1.ResourceList, error)) (Base, error) {
	if cfg.RootDir == "" {
		return Base{}, fmt.Errorf("%s plugin: RootDir is required", title)
	}
	if cfg.Mounter == nil {
		return Base{}, fmt.Errorf("%s plugin: Mounter is required", title)
	}
	if cfg.AllocatableMemory == nil && node != nil {
		cfg.AllocatableMemory = memoryOf(node)
	}
	w, err := emptydir.NewWrapper(cfg, title, pluginName)
	if err != nil {
		return Base{}, fmt.Errorf("%s plugin: %w", title, err)
	}
	r, err := rootfs.New(cfg.RootDir)
	if err != nil {
		return Base{}, fmt.Errorf("%s plugin: %w", title, err)
	}
	return Base{Wrapper: w, Root: r, Steps: cfg.Steps, alloc: node, title: title, usage: &du.Cache{}}, nil
}

// Writer returns the atomic writer of a volume's directory dir (made by
// Wrapper.SetUp) for the pod's fsGroup, with the plugin's steps hook, and
// the function to call once its Write is done, which also drops the
// volume's kept usage: the next VolumeStats measures it again, as the
// kubelet's next set-up of the volume comes with a new podvol. The writer
// resolves every name from one handle on the volume's directory, opened
// now (atomicwriter.New): one resolution from the root for the whole
// payload instead of one per file.
func (b *Base) Writer(dir string, fsGroup *int64) (*atomicwriter.Writer, func(), error) {
	w, err := atomicwriter.New(b.Root, dir, atomicwriter.Options{Steps: b.Steps, FSGroup: fsGroup})
	if err != nil {
		return nil, nil, err
	}
	return w, func() {
		b.usage.Forget(dir)
		_ = w.Close()
	}, nil
}

// VolumeStats implements volume.StatsProvider as the kubelet measures
// these kinds (du metrics in its cached metrics): the first measurement
// that succeeds after each write of the volume is kept and answered until
// the next write (Writer), which comes at every republish (each resync)
// and at each change of what the volume shows; what is kept includes the
// statfs figures of that measurement. The measurement is du.Measure: a
// walk of the volume's files, no symlink followed.
func (b *Base) VolumeStats(ctx context.Context, _ *podvol.VolumeSpec, volumePath, _ string) (volume.Stats, bool, error) {
	s, err := b.usage.Stats(ctx, b.Root, volumePath)
	if err != nil {
		return volume.Stats{}, false, fmt.Errorf("measuring %s volume at %s: %w", b.title, volumePath, err)
	}
	return s, true, nil
}

// Capabilities implements volume.Plugin: neither attached nor staged,
// never a block device, read-only in every container, and published again
// at every resync (the kubelet's RequiresRemount) and, for a plugin that
// reads objects, at each change of one. The writer gives the files the
// pod's fsGroup itself (the kubelet applies it to these volumes read-only
// or not), so no ownership change is asked for.
func (b *Base) Capabilities(*podvol.VolumeSpec) (volume.Capabilities, error) {
	return volume.Capabilities{Republish: true, ReadOnly: true}, nil
}

// TearDown implements volume.Mounter: the wrapped emptyDir's, from the
// pod's UID and the volume's name alone (the spec's source may be nil):
// the tmpfs unmounted, the directory and the ready file removed.
// Idempotent. The volume's kept usage is dropped.
func (b *Base) TearDown(ctx context.Context, req volume.MountRequest) error {
	if _, abs, err := b.Wrapper.Path(req.Volume.Pod.UID, req.Volume.SpecName); err == nil {
		b.usage.Forget(abs)
	}
	return b.Wrapper.TearDown(ctx, req.Volume.Pod.UID, req.Volume.SpecName)
}

// Reconstruct implements volume.Reconstructor: the volumes that earlier
// runs (or the kubelet) left, as the wrapped emptyDir finds them, each
// Uncertain (a process stopped in a write left its files missing or half
// linked), so that SetUp writes them again, or confirms them, for a
// running pod before the volume is reported mounted.
func (b *Base) Reconstruct(ctx context.Context, rc volume.Recovery) volume.Found {
	return b.Wrapper.Reconstruct(ctx, rc)
}

// Retake implements volume.Reconstructor: the wrapped emptyDir's.
func (b *Base) Retake(ctx context.Context, dir string, mounted map[string]bool) bool {
	return b.Wrapper.Retake(ctx, dir, mounted)
}

// NodeAllocatable returns the node's allocatable resources that the
// downward API items read for a limit a container does not declare: nil
// when no item needs them (the kubelet reads the node only then) or when
// they are not known. A node that cannot be read is an error with the
// kubelet's text, wrapping volume.ErrNotReady: the pod spec is not at
// fault.
func (b *Base) NodeAllocatable(items []v1.DownwardAPIVolumeFile) (v1.ResourceList, error) {
	if b.alloc == nil || !downward.NeedsNodeAllocatable(items) {
		return nil, nil
	}
	l, err := b.alloc()
	if err != nil {
		return nil, fmt.Errorf("error retrieving node: %w: %w", err, volume.ErrNotReady)
	}
	return l, nil
}

// memoryOf returns the memory of the node's allocatable resources that
// alloc returns, as emptydir.Config wants it.
func memoryOf(alloc func() (v1.ResourceList, error)) func() (int64, error) {
	return func() (int64, error) {
		l, err := alloc()
		if err != nil {
			return 0, err
		}
		q := l[v1.ResourceMemory] // none reported: no bound from the node, as the kubelet
		return q.Value(), nil
	}
}
