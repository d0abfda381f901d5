package resolve

import (
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/volume"
)

// PodObjects returns the API objects a pod's volumes read and keep
// current, as the plugins that read objects say them
// (volume.ObjectReader: the configMaps, secrets and ClusterTrustBundles of
// configMap, secret and projected volumes; the secret of a flexVolume's
// secretRef): the volume manager holds them in the node's one object
// cache for as long as the pod is known, as the kubelet registers a pod
// with its secret and configMap managers.
func PodObjects(readers []volume.ObjectReader, pod *v1.Pod) []objectcache.Ref {
	var out []objectcache.Ref
	for i := range pod.Spec.Volumes {
		for _, r := range readers {
			out = append(out, r.Objects(pod.Namespace, &pod.Spec.Volumes[i])...)
		}
	}
	return out
}

// ObjectReaders returns the plugins that say what a pod volume reads
// (volume.ObjectReader), for PodObjects: plugin (the CSI plugin's place),
// every built-in kind's plugin, registered or replaced by an embedder's
// (what a configMap, secret or projected source reads is the source's, and
// an embedder's plugin of that kind reads it from the same cache), and
// the embedder's own. A ref two of them give is held once (Hold).
func ObjectReaders(plugin volume.Plugin, builtin, own []volume.Plugin) []volume.ObjectReader {
	var out []volume.ObjectReader
	for _, p := range append(append([]volume.Plugin{plugin}, builtin...), own...) {
		if r, ok := p.(volume.ObjectReader); ok {
			out = append(out, r)
		}
	}
	return out
}

// PVObjects returns the API objects the pod's PVs read that the pod
// holds: the secret of a flexVolume PV's secretRef (in the PV's namespace
// for it, else the pod's), for the PVs of the pod's claims known now.
func (r *Resolver) PVObjects(pod *v1.Pod) []objectcache.Ref {
	var out []objectcache.Ref
	for _, v := range pod.Spec.Volumes {
		claim := ""
		switch {
		case v.PersistentVolumeClaim != nil:
			claim = v.PersistentVolumeClaim.ClaimName
		case v.Ephemeral != nil:
			claim = pod.Name + "-" + v.Name
		}
		if claim == "" || strings.Contains(claim, "/") || strings.Contains(pod.Namespace, "/") {
			continue
		}
		pvc, err := r.PVCs.PersistentVolumeClaims(pod.Namespace).Get(claim)
		if err != nil || pvc.Spec.VolumeName == "" {
			continue
		}
		pv, err := r.PVs.Get(pvc.Spec.VolumeName)
		if err != nil || pv.Spec.FlexVolume == nil || pv.Spec.FlexVolume.SecretRef == nil || pv.Spec.FlexVolume.SecretRef.Name == "" {
			continue
		}
		ns := pv.Spec.FlexVolume.SecretRef.Namespace
		if ns == "" {
			ns = pod.Namespace
		}
		out = append(out, objectcache.Ref{Kind: objectcache.Secret, Namespace: ns, Name: pv.Spec.FlexVolume.SecretRef.Name})
	}
	return out
}

// PodHolder is the holder name of a pod in the object podvol.
func PodHolder(uid types.UID) string { return string(uid) }
