package csiplugin

import (
	"context"
	"os"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/nodevol/nodevol/csi"
	"github.com/nodevol/nodevol/internal/fsgroup"
	"github.com/nodevol/nodevol/podvol"
)

// needsOwnership reports whether nodevol must give the pod's fsGroup
// ownership of a published volume itself, as the kubelet does: the driver
// cannot (it lacks VOLUME_MOUNT_GROUP), the volume is writable, and the
// CSIDriver's fsGroupPolicy allows it (File: always; the default
// ReadWriteOnceWithFSType: only for a volume with an fsType that is
// ReadWriteOnce, or an inline volume).
func needsOwnership(spec *podvol.VolumeSpec, vol podvol.PodVolume, caps csi.Capabilities, driver *storagev1.CSIDriver) bool {
	if vol.FSGroup == nil || caps.VolumeMountGroup || vol.ReadOnly || spec.ReadOnly {
		return false
	}
	policy := storagev1.ReadWriteOnceWithFSTypeFSGroupPolicy
	if driver != nil && driver.Spec.FSGroupPolicy != nil {
		policy = *driver.Spec.FSGroupPolicy
	}
	switch policy {
	case storagev1.FileFSGroupPolicy:
		return true
	case storagev1.ReadWriteOnceWithFSTypeFSGroupPolicy:
		// As the kubelet: inline volumes (published ReadWriteOnce), and
		// PVs that list ReadWriteOnce anywhere among their access modes;
		// not a PV without access modes.
		return spec.FSType != "" && (spec.Ephemeral || spec.AccessMode == "ReadWriteOnce" || spec.ReadWriteOnce)
	}
	return false
}

// changeOwnership gives the pod's fsGroup ownership of its published volume
// d (internal/fsgroup), reporting a change that runs long on the pod.
func (p *plugin) changeOwnership(ctx context.Context, d *os.File, vol podvol.PodVolume) error {
	return p.ownership.Change(ctx, fsgroup.Request{
		Dir: d, GID: *vol.FSGroup, OnRootMismatch: vol.FSGroupOnRootMismatch,
		Pod:    v1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: vol.Pod.Namespace, Name: vol.Pod.Name, UID: vol.Pod.UID},
		Volume: vol.SpecName,
	})
}
