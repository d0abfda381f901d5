package csiplugin

import (
	"context"
	"errors"
	"fmt"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/internal/fsutil"
	"github.com/nodevol/nodevol/podvol"

	"github.com/nodevol/nodevol/step"
	"github.com/nodevol/nodevol/volume"
)

var _ volume.SelfAttacher = (*plugin)(nil)

// errAttachmentConflict is wrapped by the error of Attach when a
// VolumeAttachment of the volume's name exists for another node or another
// driver: it is not adopted.
var errAttachmentConflict = errors.New("VolumeAttachment belongs to another node or driver")

// Attach implements volume.SelfAttacher: the node's own attach
// (self-attach mode). Like WaitForAttach it returns (nil, nil) for an
// inline volume and for a driver whose CSIDriver says attachRequired:
// false. Otherwise it creates the VolumeAttachment AttachmentName(handle,
// driver, node) as the attach/detach controller would (spec.attacher the
// driver, spec.nodeName this node, spec.source the PV's name, or for a
// volume without a PV its spec inline) unless it exists, and returns what
// WaitForAttach returns for it: the publish context once the
// external-attacher has attached it, else ErrNotReady (the caller retries
// when the VolumeAttachment changes). One that exists for another node or
// driver is a final error wrapping errAttachmentConflict.
func (p *plugin) Attach(ctx context.Context, spec *podvol.VolumeSpec) (map[string]string, error) {
	if spec.Ephemeral {
		return nil, nil
	}
	if err := fsutil.ValidateName("driver name", spec.Driver); err != nil {
		return nil, fmt.Errorf("attaching volume %s: %w", volumeDesc(spec), err)
	}
	if p.client == nil {
		return nil, fmt.Errorf("attaching volume %s: self-attach needs csiplugin.Config.KubeClient", volumeDesc(spec))
	}
	driver, err := p.csiDriver(spec.Driver)
	if err != nil {
		return nil, fmt.Errorf("attaching volume %s: %w", volumeDesc(spec), err)
	}
	if driver != nil && driver.Spec.AttachRequired != nil && !*driver.Spec.AttachRequired {
		return nil, nil
	}
	want := volumeAttachment(spec, p.node)
	// The lister first: a retry while the external-attacher works (or
	// after an agent restart) writes nothing.
	va, err := p.attachments.Get(want.Name)
	if err == nil {
		return p.checkAttachment(ctx, spec, driver, va)
	}
	vas := p.client.StorageV1().VolumeAttachments()
	if !apierrors.IsNotFound(err) {
		// Not known to the lister (the object cache's first read of it not
		// answered yet): one GET, so that a retry of an attach this node
		// started creates nothing a second time.
		va, err = vas.Get(ctx, want.Name, metav1.GetOptions{})
		if err == nil {
			return p.checkAttachment(ctx, spec, driver, va)
		} else if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("reading VolumeAttachment %s for volume %s: %w", want.Name, volumeDesc(spec), err)
		}
	}
	if err := p.steps.Take(step.Call, "create VolumeAttachment "+want.Name); err != nil {
		return nil, fmt.Errorf("creating VolumeAttachment %s for volume %s: %w", want.Name, volumeDesc(spec), err)
	}
	va, err = vas.Create(ctx, want, metav1.CreateOptions{})
	switch {
	case apierrors.IsAlreadyExists(err):
		if va, err = vas.Get(ctx, want.Name, metav1.GetOptions{}); err != nil {
			return nil, fmt.Errorf("reading VolumeAttachment %s for volume %s: %w", want.Name, volumeDesc(spec), err)
		}
	case err != nil:
		return nil, volume.WithCause(fmt.Errorf("creating VolumeAttachment %s for volume %s: %w", want.Name, volumeDesc(spec), err),
			"kubernetes.io/csi: attacher.Attach failed: "+err.Error())
	default:
		klog.FromContext(ctx).V(2).Info("Created VolumeAttachment", "volume", spec.Name, "volumeAttachment", want.Name)
	}
	return p.checkAttachment(ctx, spec, driver, va)
}

// checkAttachment refuses a VolumeAttachment of another node or driver and
// reads the status of the node's own.
func (p *plugin) checkAttachment(ctx context.Context, spec *podvol.VolumeSpec, driver *storagev1.CSIDriver, va *storagev1.VolumeAttachment) (map[string]string, error) {
	if va.Spec.NodeName != p.node || va.Spec.Attacher != spec.Driver {
		return nil, fmt.Errorf("attaching volume %s to node %s: VolumeAttachment %s exists for node %q and attacher %q: %w",
			volumeDesc(spec), p.node, va.Name, va.Spec.NodeName, va.Spec.Attacher, errAttachmentConflict)
	}
	return p.attachStatus(ctx, spec, driver, va)
}

// Detach implements volume.SelfAttacher: it deletes the
// volume's VolumeAttachment of this node (the external-attacher then
// detaches the volume and lets the object go) and returns nil once it is
// gone. While it is still there the error wraps ErrNotReady, or carries
// status.detachError's message when the external-attacher reported one.
// A VolumeAttachment of another node or driver is not touched: it is not
// the node's to delete, and nil is returned.
func (p *plugin) Detach(ctx context.Context, spec *podvol.VolumeSpec) error {
	if spec.Ephemeral {
		return nil
	}
	if p.client == nil {
		return fmt.Errorf("detaching volume %s: self-attach needs csiplugin.Config.KubeClient", volumeDesc(spec))
	}
	name := AttachmentName(spec.VolumeHandle, spec.Driver, p.node)
	vas := p.client.StorageV1().VolumeAttachments()
	// A GET, not the lister: the lister may not have seen the object
	// created a moment ago, nor its deletion.
	va, err := vas.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("reading VolumeAttachment %s for volume %s: %w", name, volumeDesc(spec), err)
	case va.Spec.NodeName != p.node || va.Spec.Attacher != spec.Driver:
		klog.FromContext(ctx).Info("Not deleting a VolumeAttachment of another node or driver", "volume", spec.Name,
			"volumeAttachment", name, "nodeName", va.Spec.NodeName, "attacher", va.Spec.Attacher)
		return nil
	}
	if va.DeletionTimestamp == nil {
		uid := va.UID
		if err := p.steps.Take(step.Call, "delete VolumeAttachment "+name); err != nil {
			return fmt.Errorf("deleting VolumeAttachment %s for volume %s: %w", name, volumeDesc(spec), err)
		}
		err := vas.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return fmt.Errorf("deleting VolumeAttachment %s for volume %s: %w", name, volumeDesc(spec), err)
		}
		klog.FromContext(ctx).V(2).Info("Deleted VolumeAttachment", "volume", spec.Name, "volumeAttachment", name)
		// Without a finalizer it is gone now; with one, the
		// external-attacher removes it once it has detached the volume.
		if va, err = vas.Get(ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			return nil
		} else if err != nil {
			return fmt.Errorf("reading VolumeAttachment %s for volume %s: %w", name, volumeDesc(spec), err)
		}
	}
	if e := va.Status.DetachError; e != nil && e.Message != "" {
		return volume.WithCause(fmt.Errorf("detaching volume %s from node %s failed (VolumeAttachment %s): %s", volumeDesc(spec), p.node, name, e.Message), e.Message)
	}
	return fmt.Errorf("waiting for VolumeAttachment %s of driver %s for volume %s to be detached and deleted: %w",
		name, spec.Driver, volumeDesc(spec), volume.ErrNotReady)
}

// volumeAttachment is the VolumeAttachment the attach/detach controller
// would create for spec on node: for a volume without a PV (an inline
// volume translated to CSI) its source is the volume's spec inline.
func volumeAttachment(spec *podvol.VolumeSpec, node string) *storagev1.VolumeAttachment {
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: AttachmentName(spec.VolumeHandle, spec.Driver, node)},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: spec.Driver,
			NodeName: node,
		},
	}
	if spec.PVName != "" {
		pv := spec.PVName
		va.Spec.Source.PersistentVolumeName = &pv
		return va
	}
	va.Spec.Source.InlineVolumeSpec = inlineVolumeSpec(spec)
	return va
}

// inlineVolumeSpec is the PersistentVolumeSpec of a volume without a PV.
func inlineVolumeSpec(spec *podvol.VolumeSpec) *v1.PersistentVolumeSpec {
	secret := func(r *podvol.SecretRef) *v1.SecretReference {
		if r == nil {
			return nil
		}
		return &v1.SecretReference{Namespace: r.Namespace, Name: r.Name}
	}
	pvs := &v1.PersistentVolumeSpec{
		PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{
			Driver:               spec.Driver,
			VolumeHandle:         spec.VolumeHandle,
			ReadOnly:             spec.ReadOnly,
			FSType:               spec.FSType,
			VolumeAttributes:     spec.Attributes,
			NodeStageSecretRef:   secret(spec.NodeStageSecret),
			NodePublishSecretRef: secret(spec.NodePublishSecret),
			NodeExpandSecretRef:  secret(spec.NodeExpandSecret),
		}},
		MountOptions: spec.MountOptions,
	}
	if spec.AccessMode != "" {
		pvs.AccessModes = []v1.PersistentVolumeAccessMode{v1.PersistentVolumeAccessMode(spec.AccessMode)}
	}
	if spec.Mode != "" {
		mode := v1.PersistentVolumeMode(spec.Mode)
		pvs.VolumeMode = &mode
	}
	return pvs
}
