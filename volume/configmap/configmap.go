// Package configmap is the volume plugin of configMap pod volumes
// ("kubernetes.io/configmap"): the keys of a ConfigMap of the pod's
// namespace as files, kept current as the ConfigMap changes.
//
// It does what the kubelet v1.37's configmap plugin does, on the kubelet's
// layout, so that a node can pass between the kubelet and nodevol:
//
//   - the volume is the directory
//     {root}/pods/{uid}/volumes/kubernetes.io~configmap/{name}, a wrapped
//     emptyDir on disk (its ready file is that of the emptyDir
//     wrapped_{name}), written by the atomic writer (internal/atomicwriter):
//     each key a link through ..data to a timestamped directory that an
//     update replaces at once;
//   - every key of data and binaryData is a file named after it, or only
//     the items' keys at their paths; a file's mode is its item's mode, or
//     the source's defaultMode (0644 when the pod spec skipped defaulting,
//     as the API server defaults it); the pod's fsGroup owns every file
//     with group read;
//   - a missing ConfigMap is the kubelet's error (`configmap "x" not
//     found`), an item whose key is missing too (`configmap references
//     non-existent config key: k`), both retried; an optional source makes
//     a missing ConfigMap an empty volume and skips missing keys;
//   - SetUp runs again at each resync and each change of the ConfigMap,
//     and changes nothing when the files are the same;
//   - TearDown removes the directory from its path alone; a directory found
//     at start is Uncertain (Reconstruct), so that SetUp writes it again.
//
// Beyond the kubelet, a key or item path that would leave the volume
// ("..", "/" in a key, an absolute path) is refused before anything is
// written, and a failed update leaves the old files in place (the kubelet
// tears the volume down when its write fails).
//
// What the kubelet does and this plugin does not: the directories of
// nested mount points (another volume mounted inside this one's mount
// path, which the container runtime then creates) and the alpha user
// fields (defaultUser, items[].user of AtomicWriteVolumeUserFields).
//
// Usage (VolumeStats) is the kubelet's: a du walk of the volume, kept until
// the volume is written again (at each resync or change of the ConfigMap).
package configmap

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/nodevol/nodevol/internal/atomicwriter"
	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/internal/objvolume"
)

// PluginName is the plugin's name, the kubelet's.
const PluginName = "kubernetes.io/configmap"

// Objects is what the plugin reads ConfigMaps from: the node's object cache
// (objectcache.Cache). Get answers apierrors.IsNotFound for a missing
// object.
type Objects = objvolume.Objects

// Config configures the plugin: RootDir, Mounter and Objects are
// required; Steps and AllocatableMemory are optional.
type Config = objvolume.Config

// New returns the configmap plugin; it implements volume.SpecResolver,
// volume.Reconstructor and volume.ObjectReader (Refs) too.
func New(cfg Config) (volume.Plugin, error) { return objvolume.New(kind, cfg) }

// refs returns the objects a configMap volume of a pod in namespace ns
// reads: its ConfigMap, held whether or not the source is optional (an
// optional ConfigMap that appears later fills the volume). None for a nil
// source or one that names nothing.
func refs(ns string, src *v1.ConfigMapVolumeSource) []objectcache.Ref {
	return objvolume.Refs(kind, ns, &v1.VolumeSource{ConfigMap: src})
}

var kind = objvolume.Kind{
	Name:        PluginName,
	Title:       "configMap",
	Object:      objectcache.ConfigMap,
	Resource:    "configmap",
	DefaultMode: v1.ConfigMapVolumeSourceDefaultMode,
	Source: func(vs *v1.VolumeSource) (objvolume.Source, bool) {
		s := vs.ConfigMap
		if s == nil {
			return objvolume.Source{}, false
		}
		return objvolume.Source{Name: s.Name, Items: s.Items, DefaultMode: s.DefaultMode, Optional: s.Optional}, true
	},
	Payload: func(obj runtime.Object, it atomicwriter.Items) (map[string]atomicwriter.File, error) {
		if obj == nil {
			return atomicwriter.ConfigMapPayload(nil, it)
		}
		cm, ok := obj.(*v1.ConfigMap)
		if !ok {
			return nil, fmt.Errorf("read a %T, not a ConfigMap", obj)
		}
		return atomicwriter.ConfigMapPayload(cm, it)
	},
}
