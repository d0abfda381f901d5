package volumemanager

import (
	"sort"

	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/podvol"
)

// podVolumes returns the volumes pod uid may have mounted, as the actual
// state has them, each under every name the pod has for it. A pod may
// have one volume under several names (a PVC in two of its volumes, as
// kubernetes#122140 allows): it is mounted once for the pod (one publish,
// one directory, named after the PV), and, as in the kubelet's
// GetMountedVolumesForPod, each name lists that mount. A name that asks
// for read-only lists it read-only although another name made the mount
// writable. A volume the pod no longer wants (being unmounted, or the pod
// is deleted) keeps the name it was mounted under. Sorted by name.
func (vm *VolumeManager) podVolumes(uid types.UID) []podvol.MountedVolume {
	vols := vm.asw.PodVolumes(uid)
	out := vols[:0:0]
	for _, v := range vols {
		names := vm.dsw.SpecNames(uid, v.Name)
		if len(names) == 0 {
			out = append(out, v)
			continue
		}
		for _, n := range names {
			c := v
			c.SpecName, c.ReadOnly = n.Name, v.ReadOnly || n.ReadOnly
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].SpecName < out[j].SpecName })
	return out
}

// sharedCauses gives each name of the pod that shares its volume's mount
// with another name the error of that mount (operations go by the name
// the mount carries), where the name has none of its own.
func sharedCauses(causes map[string]error, shared map[string]string) {
	for name, mountName := range shared {
		if causes[name] == nil && causes[mountName] != nil {
			causes[name] = causes[mountName]
		}
	}
}
