package planner

import (
	"fmt"
	"slices"

	storagev1 "k8s.io/api/storage/v1"
)

// LifecycleModeError is wrapped by the error of a pod refused a volume
// whose driver does not support the way the pod uses it (inline or through
// a PV). Not final: a change of the driver's CSIDriver plans the volume
// again, and the refusal ends once the mode is listed.
type LifecycleModeError struct {
	Driver string
	// Mode is the volume's; Modes the driver's (CSIDriver
	// volumeLifecycleModes, or the default).
	Mode  storagev1.VolumeLifecycleMode
	Modes []storagev1.VolumeLifecycleMode
}

func (e *LifecycleModeError) Error() string {
	return fmt.Sprintf("CSI driver %s does not support volume lifecycle mode %s (CSIDriver volumeLifecycleModes: %v)", e.Driver, e.Mode, e.Modes)
}

// lifecycleRefusal says why no pod may use the volume when its driver does
// not support its lifecycle mode (Caps.LifecycleModes), as the kubelet
// refuses it at mount: Ephemeral for a CSI volume inline in the pod,
// Persistent otherwise. nil when the mode is supported, or the plugin
// lists none.
func lifecycleRefusal(v View) error {
	modes := v.Caps.LifecycleModes
	if len(modes) == 0 {
		return nil
	}
	want := storagev1.VolumeLifecyclePersistent
	if v.Spec.Ephemeral {
		want = storagev1.VolumeLifecycleEphemeral
	}
	if slices.Contains(modes, want) {
		return nil
	}
	return &LifecycleModeError{Driver: v.Spec.Driver, Mode: want, Modes: modes}
}
