package csiplugin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"

	"google.golang.org/grpc/codes"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/internal/fsutil"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// WaitForAttach implements volume.Attacher. It returns (nil,
// nil) for an inline (ephemeral) volume and for a driver whose CSIDriver
// object says attachRequired: false; a driver without a CSIDriver object
// needs attaching, as in the kubelet. Otherwise it reads the
// VolumeAttachment AttachmentName(handle, driver, node) from the lister and
//
//   - returns its status.attachmentMetadata (the publish context, never
//     nil) when it is attached;
//   - fails for good when it is being deleted, or with the attacher's
//     status.attachError message; an attachError whose errorCode is
//     ResourceExhausted, for a driver whose CSIDriver sets
//     nodeAllocatableUpdatePeriodSeconds, is a *volume.AttachLimitError
//     (the node has reached the driver's attach limit), as the kubelet's
//     VerifyExhaustedResource reads it;
//   - returns an error wrapping ErrNotReady when it is missing or not
//     attached yet: the caller retries when the VolumeAttachment changes.
//
// It never blocks and never calls the API server.
func (p *plugin) WaitForAttach(ctx context.Context, spec *podvol.VolumeSpec) (map[string]string, error) {
	if spec.Ephemeral {
		return nil, nil
	}
	if err := fsutil.ValidateName("driver name", spec.Driver); err != nil {
		return nil, fmt.Errorf("waiting for attach of volume %s: %w", volumeDesc(spec), err)
	}
	driver, err := p.csiDriver(spec.Driver)
	if err != nil {
		return nil, fmt.Errorf("waiting for attach of volume %s: %w", volumeDesc(spec), err)
	}
	if driver != nil && driver.Spec.AttachRequired != nil && !*driver.Spec.AttachRequired {
		return nil, nil
	}
	name := AttachmentName(spec.VolumeHandle, spec.Driver, p.node)
	va, err := p.attachments.Get(name)
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("waiting for VolumeAttachment %s of driver %s for volume %s to be attached: it does not exist yet%s: %w",
			name, spec.Driver, volumeDesc(spec), attachRequiredBy(driver, spec.Driver), volume.ErrNotReady)
	case err != nil:
		return nil, fmt.Errorf("reading VolumeAttachment %s for volume %s: %w (%w)", name, volumeDesc(spec), err, volume.ErrNotReady)
	}
	return p.attachStatus(ctx, spec, driver, va)
}

// attachStatus reads the status of the volume's VolumeAttachment va (of
// the CSIDriver driver, nil when there is none): the publish context
// (never nil) once attached, a final error when it is being deleted or
// the attacher reported an error, else ErrNotReady.
func (p *plugin) attachStatus(ctx context.Context, spec *podvol.VolumeSpec, driver *storagev1.CSIDriver, va *storagev1.VolumeAttachment) (map[string]string, error) {
	name := va.Name
	switch {
	case va.DeletionTimestamp != nil:
		return nil, volume.WithCause(fmt.Errorf("VolumeAttachment %s for volume %s is being deleted", name, volumeDesc(spec)), "volume attachment is being deleted")
	case va.Status.Attached:
		klog.FromContext(ctx).V(4).Info("Volume attached", "volume", spec.Name, "volumeAttachment", name)
		pc := maps.Clone(va.Status.AttachmentMetadata)
		if pc == nil {
			pc = map[string]string{}
		}
		return pc, nil
	case attachLimitReached(driver, va):
		return nil, &volume.AttachLimitError{Volume: volumeDesc(spec), Node: p.node, Driver: spec.Driver,
			VolumeAttachment: name, Message: va.Status.AttachError.Message}
	case va.Status.AttachError != nil && va.Status.AttachError.ErrorCode != nil:
		// The kubelet's words: the attacher's message alone.
		return nil, volume.WithCause(fmt.Errorf("attaching volume %s to node %s failed (VolumeAttachment %s, code %s): %s",
			volumeDesc(spec), p.node, name, codes.Code(*va.Status.AttachError.ErrorCode), va.Status.AttachError.Message), va.Status.AttachError.Message)
	case va.Status.AttachError != nil && va.Status.AttachError.Message != "":
		return nil, volume.WithCause(fmt.Errorf("attaching volume %s to node %s failed (VolumeAttachment %s): %s",
			volumeDesc(spec), p.node, name, va.Status.AttachError.Message), va.Status.AttachError.Message)
	}
	return nil, fmt.Errorf("waiting for VolumeAttachment %s of driver %s for volume %s to be attached%s: %w",
		name, spec.Driver, volumeDesc(spec), attachRequiredBy(driver, spec.Driver), volume.ErrNotReady)
}

// attachRequiredBy says, for a volume waiting for its attachment, why it
// needs one when the driver has no CSIDriver object (driver nil): the
// kubelet attaches such a volume, and so does nodevol, but a user who
// forgot the CSIDriver of a driver that needs no attach should learn that
// from the wait. "" when the CSIDriver exists (it says attachRequired).
func attachRequiredBy(driver *storagev1.CSIDriver, name string) string {
	if driver != nil {
		return ""
	}
	return fmt.Sprintf(" (%s: without one a volume needs attaching, as with the kubelet; "+
		"a driver that attaches nothing says attachRequired: false in its CSIDriver)", missingCSIDriver(name))
}

// missingCSIDriver is how every message says that a driver has no
// CSIDriver object.
func missingCSIDriver(name string) string {
	return fmt.Sprintf("CSIDriver %s not found in the API", name)
}

// attachLimitReached reports whether the attacher failed to attach va
// because the node has reached the driver's attach limit: an attachError
// with errorCode ResourceExhausted, taken so only for a driver whose
// CSIDriver sets nodeAllocatableUpdatePeriodSeconds (its CSINode count can
// be refreshed, so the scheduler learns the limit), as the kubelet does.
func attachLimitReached(driver *storagev1.CSIDriver, va *storagev1.VolumeAttachment) bool {
	e := va.Status.AttachError
	if e == nil || e.ErrorCode == nil || codes.Code(*e.ErrorCode) != codes.ResourceExhausted {
		return false
	}
	return driver != nil && driver.Spec.NodeAllocatableUpdatePeriodSeconds != nil && *driver.Spec.NodeAllocatableUpdatePeriodSeconds > 0
}

// AttachmentName returns the name of the VolumeAttachment that attaches a
// volume to a node: "csi-" + hex(sha256(volumeHandle + driver + nodeName)).
func AttachmentName(volumeHandle, driver, nodeName string) string {
	sum := sha256.Sum256([]byte(volumeHandle + driver + nodeName))
	return "csi-" + hex.EncodeToString(sum[:])
}

// AttachmentName implements volume.AttachmentNamer: the VolumeAttachment
// that attaches spec's volume to this node, which the attach/detach
// controller (or SelfAttach) names so.
func (p *plugin) AttachmentName(spec *podvol.VolumeSpec) string {
	return AttachmentName(spec.VolumeHandle, spec.Driver, p.node)
}
