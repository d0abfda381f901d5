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
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// PluginName is the plugin's name, the kubelet's.
const PluginName = "kubernetes.io/image"

// Plugin is the image volume plugin. The zero value is ready to use.
type Plugin struct{}

var _ volume.Plugin = Plugin{}

// VolumeName is the unique name of pod's image volume specName, the
// kubelet's for a volume that is neither attached nor staged.
func VolumeName(pod types.UID, specName string) podvol.UniqueVolumeName {
	return podvol.UniqueVolumeName(fmt.Sprintf("%s/%s-%s", PluginName, pod, specName))
}

// Name implements volume.Plugin.
func (Plugin) Name() string { return PluginName }

// CanSupport implements volume.Plugin: pod volumes with an image source.
func (Plugin) CanSupport(v *v1.Volume) bool { return v != nil && v.Image != nil }

// Capabilities implements volume.Plugin: an image volume is neither
// attached nor staged, never a block device, never published again, and
// its files are the image's (the runtime mounts it read-only); the
// runtime provides it.
func (Plugin) Capabilities(*podvol.VolumeSpec) (volume.Capabilities, error) {
	return volume.Capabilities{ProvidedByRuntime: true}, nil
}

// SetUp implements volume.Mounter: the runtime mounts the image when it
// creates the containers, so there is nothing to do and no path.
func (Plugin) SetUp(context.Context, volume.MountRequest) (string, error) { return "", nil }

// TearDown implements volume.Mounter: the runtime unmounts the image with
// the containers.
func (Plugin) TearDown(context.Context, volume.MountRequest) error { return nil }
