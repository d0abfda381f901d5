package reconciler

import (
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volumemanager/internal/resolve"
)

// adoptAttachments takes in, once the informers have synced, the
// VolumeAttachments this node created (self-attach mode) whose volumes
// left nothing on disk: a stop between creating one and staging its
// volume, or between unstaging a volume and deleting its attachment,
// leaves no directory for reconstruction to find, and the volume would
// stay attached to the node for good. Each becomes a known volume, self
// attached with nothing staged, held as what is found on disk is held
// until the pods are synced; then it is detached if no pod wants it, and
// used as it is if one does. Only an attachment named as this node names
// its own (as the volume's plugin names it: volume.AttachmentNamer) is
// taken, and only while its PersistentVolume is there to say which volume
// it is. The list is let go afterwards (a one-time list's memory).
func (l *Loop) adoptAttachments() {
	if l.OwnAttachments == nil {
		return
	}
	src := l.OwnAttachments
	l.OwnAttachments = nil
	vas, err := src.List(labels.Everything())
	if err != nil {
		l.logger.Error(err, "Cannot list the VolumeAttachments this node may have created in an earlier run")
		return
	}
	for _, va := range vas {
		pvName := va.Spec.Source.PersistentVolumeName
		if va.Spec.NodeName != l.Node || pvName == nil || va.DeletionTimestamp != nil {
			continue
		}
		pv, err := src.Volume(*pvName)
		if err != nil {
			l.logger.Info("Leaving a VolumeAttachment of this node whose PersistentVolume cannot be read", "volumeAttachment", va.Name, "pv", *pvName, "err", err.Error())
			continue
		}
		spec, err := resolve.PVSpec(pv)
		if err != nil || spec.Driver != va.Spec.Attacher || l.attachmentName(&spec) != va.Name {
			continue
		}
		if _, known := l.ASW.Volume(spec.Name); known {
			continue // found on disk, and self attached already (install)
		}
		l.ASW.SetSelfAttached(spec, true)
		l.vol(spec.Name).foundDevice = true
		l.queue.add(spec.Name)
		l.logger.V(2).Info("Found a VolumeAttachment of this node from an earlier run with nothing on disk; it is detached unless a pod wants its volume", "volume", spec.Name, "volumeAttachment", va.Name)
	}
}

// attachmentName is the VolumeAttachment that spec's volume waits for,
// as its plugin names it (volume.AttachmentNamer); "" when it waits for
// none.
func (l *Loop) attachmentName(spec *podvol.VolumeSpec) string {
	p, err := l.Volumes.ForVolume(spec.Name)
	if err != nil {
		return ""
	}
	if n, ok := p.(volume.AttachmentNamer); ok {
		return n.AttachmentName(spec)
	}
	return ""
}

// AttachmentLister lists the VolumeAttachments (at least this node's),
// and reads the PersistentVolumes they attach, for adoptAttachments.
type AttachmentLister interface {
	List(selector labels.Selector) ([]*storagev1.VolumeAttachment, error)
	Volume(name string) (*v1.PersistentVolume, error)
}
