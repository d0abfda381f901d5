package planner

import (
	"fmt"

	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/podvol"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
)

// SELinuxConflictError is the error of a pod that would mount a volume with
// another SELinux context than a pod that already uses it (the kubelet's
// "conflicting SELinux labels of volume"). The pod waits until the other
// pods are gone; they are not touched.
type SELinuxConflictError struct {
	// Volume is the unique volume name; Driver its CSI driver.
	Volume podvol.UniqueVolumeName
	Driver string
	// Pod is the pod that waits, Context the context it would mount with.
	Pod     podvol.PodRef
	Context string
	// Other is a pod that uses the volume with OtherContext.
	Other        podvol.PodRef
	OtherContext string
}

func (e *SELinuxConflictError) Error() string {
	q := func(s string) string {
		if s == "" {
			return "no SELinux context"
		}
		return fmt.Sprintf("SELinux context %q", s)
	}
	return fmt.Sprintf("conflicting SELinux labels of volume %s (driver %s): pod %s would mount it with %s, but pod %s uses it with %s; "+
		"a volume is mounted with one context at a time, so pod %s waits until the volume is no longer used by pod %s",
		e.Volume, e.Driver, e.Pod, q(e.Context), e.Other, q(e.OtherContext), e.Pod, e.Other)
}

// seLinuxAdmission is what admitSELinux decides for one volume.
type seLinuxAdmission struct {
	// Context is the context the device is staged with, and the pods
	// admitted have.
	Context string
	// Mounted: Context is that of a desired pod that may already have the
	// volume mounted.
	Mounted bool
	// Refused are the desired pods that must wait, by UID.
	Refused map[types.UID]*SELinuxConflictError
}

// admitSELinux decides which of a volume's desired pods may mount it, and
// the context its device is staged with. It is pure: the planner calls it.
//
// The context is fixed by the first of, in UID order: a desired pod that
// may already have the volume mounted (the context it has it with; it is
// never refused), else a desired pod with the context the device is
// staged with (or being staged with), else the first desired pod. Every
// other desired pod that may not have it mounted yet and wants another
// context is refused. A device staged with a context no desired pod
// wants is staged again once nothing uses it (the planner's job).
func admitSELinux(v View) seLinuxAdmission {
	var anchor *podvol.PodVolume
	label := func(p podvol.PodVolume) (string, bool) {
		if pm, ok := v.Actual.Pods[p.Pod.UID]; ok && pm.MayBeMounted() {
			return pm.Volume.SELinuxLabel, true
		}
		return p.SELinuxLabel, false
	}
	var ctx string
	mountedAnchor := false
	for i, p := range v.Desired {
		if l, mounted := label(p); mounted {
			anchor, ctx, mountedAnchor = &v.Desired[i], l, true
			break
		}
	}
	if anchor == nil && deviceContextValid(v) {
		for i, p := range v.Desired {
			if p.SELinuxLabel == v.Actual.SELinuxContext {
				anchor, ctx = &v.Desired[i], p.SELinuxLabel
				break
			}
		}
	}
	if anchor == nil {
		if len(v.Desired) == 0 {
			return seLinuxAdmission{}
		}
		anchor, ctx = &v.Desired[0], v.Desired[0].SELinuxLabel
	}
	out := seLinuxAdmission{Context: ctx, Mounted: mountedAnchor}
	for _, p := range v.Desired {
		if l, mounted := label(p); mounted || l == ctx {
			continue
		}
		if out.Refused == nil {
			out.Refused = map[types.UID]*SELinuxConflictError{}
		}
		out.Refused[p.Pod.UID] = &SELinuxConflictError{Volume: v.Name, Driver: v.Spec.Driver,
			Pod: p.Pod, Context: p.SELinuxLabel, Other: anchor.Pod, OtherContext: ctx}
	}
	return out
}

// deviceContextValid reports whether the device may be staged (or is
// being staged), so that the context it was staged with counts.
func deviceContextValid(v View) bool {
	if v.Spec.Ephemeral {
		return false
	}
	if v.InFlight[oe.Key{Volume: v.Name}] == oe.OpStage {
		return true
	}
	return v.Known && v.Actual.DeviceState.MayBeMounted()
}
