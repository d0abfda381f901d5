package volume

import (
	"errors"
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/podvol"
)

// SpecResolver is implemented by a plugin whose volumes need more of the
// pod than their source, or a check the pod's resolution should fail on:
// an emptyDir of medium Memory is sized by the pod's memory limit, a
// hostPath's type must be one the kubelet knows. The volume manager calls
// it once per pod volume (and per PV of a PVPlugin) when it resolves the
// pod, with the spec it built (Name, Plugin, Mode, Source or PVSource);
// the plugin checks it and may set spec.Attributes, which only it reads.
// An error is final for the pod's volume (the pod spec must change),
// unless it wraps ErrNotReady: what the plugin needs is not known yet (the
// Node's allocatable resources), and the pod is resolved again.
type SpecResolver interface {
	ResolveSpec(pod *v1.Pod, spec *podvol.VolumeSpec) error
}

// PVPlugin is implemented by a plugin that handles PersistentVolumes of a
// kind of its own (hostPath, local, nfs): a claim bound to such a PV is
// resolved to a volume of the plugin, with the PV's source in
// spec.PVSource. The CSI plugin, which handles CSI PVs and the in-tree
// PVs that CSI migration translates, is asked first and does not
// implement it.
type PVPlugin interface {
	CanSupportPV(pv *v1.PersistentVolume) bool
}

// ForPV returns the plugin that handles pv among the registered
// PVPlugins. It is an error, naming the PV and its kind, when none does
// (wrapping ErrNoPlugin, and naming what replaces the kind when it is one
// nodevol leaves out: ReplacedBy) or when more than one claims it.
func (r *Registry) ForPV(pv *v1.PersistentVolume) (Plugin, error) {
	if pv == nil {
		return nil, errors.New("looking up the plugin of a PersistentVolume: nil PV")
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	var match []string
	for _, n := range r.names {
		if p, ok := r.plugins[n].(PVPlugin); ok && p.CanSupportPV(pv) {
			match = append(match, n)
		}
	}
	switch len(match) {
	case 0:
		kind := pvSourceKind(&pv.Spec.PersistentVolumeSource)
		return nil, fmt.Errorf("PV %s of kind %s: %w (registered: %s)%s", pv.Name, kind, ErrNoPlugin, r.list(), hint(kind))
	case 1:
		return r.plugins[match[0]], nil
	}
	return nil, fmt.Errorf("PV %s of kind %s: claimed by more than one volume plugin (%s)", pv.Name, pvSourceKind(&pv.Spec.PersistentVolumeSource), strings.Join(match, ", "))
}

// pvSourceKind names the kind of a PV's source as the PV spec spells it
// ("csi", "local", "hostPath", ...), for messages; "no source" when none
// is set.
func pvSourceKind(src *v1.PersistentVolumeSource) string {
	return kindOf(src)
}
