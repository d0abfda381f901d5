package planner

import (
	"errors"
	"fmt"
	"sort"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/podvol"
)

// ErrReadWriteOncePod is wrapped by the error of a pod refused a
// ReadWriteOncePod volume that another pod on the node uses.
var ErrReadWriteOncePod = errors.New("the volume has access mode ReadWriteOncePod")

// rwopRefusals decides which desired pods of a ReadWriteOncePod volume may
// not use it, and why: the scheduler keeps a second pod off the node, but
// static pods and pods with nodeName set bypass it, and the kubelet refuses
// them at mount ("already in use by another pod").
//
// The volume belongs to the pods that may have it published (Mounted,
// Uncertain, or with a publish in flight), whether or not they still want
// it: a pod being torn down keeps it until its unpublish has finished. When
// none has it, the first desired pod (by UID) gets it. Every other desired
// pod is refused; nothing of the owner's is touched. The result is nil for
// any other access mode. Pure: it reads only the view.
func rwopRefusals(v View) map[types.UID]error {
	if v.Spec.AccessMode != string(v1.ReadWriteOncePod) || len(v.Desired) == 0 {
		return nil
	}
	var owners []podvol.PodRef
	for uid, pm := range v.Actual.Pods {
		if pm.MayBeMounted() {
			ref := pm.Volume.Pod
			ref.UID = uid
			owners = append(owners, ref)
		}
	}
	if len(owners) == 0 {
		owners = []podvol.PodRef{v.Desired[0].Pod} // Desired is sorted by UID
	}
	sort.Slice(owners, func(i, j int) bool { return owners[i].UID < owners[j].UID })
	owns := map[types.UID]bool{}
	for _, o := range owners {
		owns[o.UID] = true
	}
	var out map[types.UID]error
	for _, p := range v.Desired {
		if owns[p.Pod.UID] {
			continue
		}
		if out == nil {
			out = map[types.UID]error{}
		}
		out[p.Pod.UID] = fmt.Errorf("pod %s cannot use volume %s%s: %w and is in use by pod %s on this node; it is mounted once that pod has released it",
			p.Pod, volumeName(v.Spec), claimSuffix(v.Spec), ErrReadWriteOncePod, owners[0])
	}
	return out
}

// volumeName names a volume in messages: its PV, else its unique name.
func volumeName(spec podvol.VolumeSpec) string {
	if spec.PVName != "" {
		return spec.PVName
	}
	return string(spec.Name)
}

func claimSuffix(spec podvol.VolumeSpec) string {
	if spec.Claim == "" {
		return ""
	}
	return " (claim " + spec.Claim + ")"
}
