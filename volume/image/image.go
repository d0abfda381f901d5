// Package image is the volume plugin of image volumes (pod volumes with an
// image source), which the container runtime mounts itself: nodevol has
// nothing to attach, stage, publish or take down for them.
//
// It does what the kubelet's kubernetes.io/image plugin does: a volume's
// unique name is the pod-scoped {plugin}/{podUID}-{specName}, SetUp and
// TearDown do nothing, and the volume has no path on the node, no
// ownership change, no SELinux relabelling, no expansion, no stats and
// nothing on disk to reconstruct. The runtime pulls the image (by the pod's
// pull policy and secrets) and mounts it read-only when it creates the
// containers.
package image

import (
	"context"

	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// PluginName is the plugin's name, the kubelet's.
const PluginName = "kubernetes.io/image"

// New returns the image volume plugin.
func New() volume.Plugin { return plugin{} }

// plugin is the image volume plugin: it holds nothing.
type plugin struct{}

// Name implements volume.Plugin.
func (plugin) Name() string { return PluginName }

// CanSupport implements volume.Plugin: pod volumes with an image source.
func (plugin) CanSupport(v *v1.Volume) bool { return v != nil && v.Image != nil }

// Capabilities implements volume.Plugin: an image volume is neither
// attached nor staged, never a block device, never published again, and
// its files are the image's (the runtime mounts it read-only); the
// runtime provides it.
func (plugin) Capabilities(*podvol.VolumeSpec) (volume.Capabilities, error) {
	return volume.Capabilities{ProvidedByRuntime: true}, nil
}

// SetUp implements volume.Mounter: the runtime mounts the image when it
// creates the containers, so there is nothing to do and no path.
func (plugin) SetUp(context.Context, volume.MountRequest) (string, error) { return "", nil }

// TearDown implements volume.Mounter: the runtime unmounts the image with
// the containers.
func (plugin) TearDown(context.Context, volume.MountRequest) error { return nil }
