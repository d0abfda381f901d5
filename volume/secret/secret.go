// Package secret is the volume plugin of secret pod volumes
// ("kubernetes.io/secret"): the keys of a Secret of the pod's namespace as
// files on a tmpfs, never on disk, kept current as the Secret changes.
//
// It does what the kubelet v1.37's secret plugin does, on the kubelet's
// layout, so that a node can pass between the kubelet and nodevol:
//
//   - the volume is a tmpfs mounted at
//     {root}/pods/{uid}/volumes/kubernetes.io~secret/{name}, a wrapped
//     emptyDir of medium Memory (its ready file is that of the emptyDir
//     wrapped_{name}) sized as the kubelet sizes it (the smaller of the
//     pod's memory limit and the node's allocatable memory, computed by
//     ResolveSpec), written by the atomic writer (internal/atomicwriter):
//     each key a link through ..data to a timestamped directory that an
//     update replaces at once;
//   - every key of data is a file named after it, or only the items' keys
//     at their paths; a file's mode is its item's mode, or the source's
//     defaultMode (0644 when the pod spec skipped defaulting, as the API
//     server defaults it); the pod's fsGroup owns every file with group
//     read;
//   - a missing Secret is the kubelet's error (`secret "x" not found`), an
//     item whose key is missing too (`references non-existent secret key:
//     k`), both retried; an optional source makes a missing Secret an
//     empty volume and skips missing keys;
//   - SetUp runs again at each resync and each change of the Secret, and
//     changes nothing when the files are the same;
//   - TearDown unmounts the tmpfs and removes the directory from its path
//     alone; a volume found at start is Uncertain (Reconstruct), its tmpfs
//     mounted or not, so that SetUp completes or confirms its files before
//     it is reported mounted again.
//
// Beyond the kubelet, a key or item path that would leave the volume
// ("..", "/" in a key, an absolute path) is refused before anything is
// written, and a failed update leaves the old files in place (the kubelet
// tears the volume down when its write fails).
//
// What the kubelet does and this plugin does not: the directories of
// nested mount points (another volume mounted inside this one's mount
// path, which the container runtime then creates), the alpha user fields
// (defaultUser, items[].user of AtomicWriteVolumeUserFields) and resizing
// the tmpfs when the pod is resized.
//
// Usage (VolumeStats) is the kubelet's: a du walk of the tmpfs, kept until
// the volume is written again (at each resync or change of the Secret).
//
// ResolveSpec stores the tmpfs size in bytes in spec.Attributes
// ("sizeBytes", decimal; "0" when nothing bounds it), read by this plugin
// only.
package secret

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
const PluginName = "kubernetes.io/secret"

// Config configures the plugin: RootDir, Mounter and Objects are
// required; Steps and AllocatableMemory are optional.
type Config = objvolume.Config

// New returns the secret plugin; it implements volume.SpecResolver and
// volume.Reconstructor too.
func New(cfg Config) (volume.Plugin, error) { return objvolume.New(kind, cfg) }

// refs returns the objects a secret volume of a pod in namespace ns
// reads: its Secret, held whether or not the source is optional (an
// optional Secret that appears later fills the volume). None for a nil
// source or one that names nothing.
func refs(ns string, src *v1.SecretVolumeSource) []objectcache.Ref {
	return objvolume.Refs(kind, ns, &v1.VolumeSource{Secret: src})
}

var kind = objvolume.Kind{
	Name:        PluginName,
	Title:       "secret",
	Object:      objectcache.Secret,
	Resource:    "secret",
	Memory:      true,
	DefaultMode: v1.SecretVolumeSourceDefaultMode,
	Source: func(vs *v1.VolumeSource) (objvolume.Source, bool) {
		s := vs.Secret
		if s == nil {
			return objvolume.Source{}, false
		}
		return objvolume.Source{Name: s.SecretName, Items: s.Items, DefaultMode: s.DefaultMode, Optional: s.Optional}, true
	},
	Payload: func(obj runtime.Object, it atomicwriter.Items) (map[string]atomicwriter.File, error) {
		if obj == nil {
			return atomicwriter.SecretPayload(nil, it)
		}
		s, ok := obj.(*v1.Secret)
		if !ok {
			return nil, fmt.Errorf("read a %T, not a Secret", obj)
		}
		return atomicwriter.SecretPayload(s, it)
	},
}
