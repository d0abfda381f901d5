package volumemanager

import (
	"k8s.io/apimachinery/pkg/labels"

	"github.com/nodevol/nodevol/csiplugin"
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
// its own (csi-sha256 of handle, driver and node) is taken, and only while
// its PersistentVolume is there to say which volume it is.
func (l *loop) adoptAttachments() {
	if l.ownAttachments == nil {
		return
	}
	vas, err := l.ownAttachments.List(labels.Everything())
	if err != nil {
		l.logger.Error(err, "Cannot list the VolumeAttachments this node may have created in an earlier run")
		return
	}
	for _, va := range vas {
		pvName := va.Spec.Source.PersistentVolumeName
		if va.Spec.NodeName != l.node || pvName == nil || va.DeletionTimestamp != nil {
			continue
		}
		pv, err := l.pods.resolver.pvs.Get(*pvName)
		if err != nil {
			l.logger.Info("Leaving a VolumeAttachment of this node whose PersistentVolume cannot be read", "volumeAttachment", va.Name, "pv", *pvName, "err", err.Error())
			continue
		}
		spec, err := pvSpec(pv)
		if err != nil || spec.Driver != va.Spec.Attacher || csiplugin.AttachmentName(spec.VolumeHandle, spec.Driver, l.node) != va.Name {
			continue
		}
		if _, known := l.asw.Volume(spec.Name); known {
			continue // found on disk, and self attached already (install)
		}
		l.asw.SetSelfAttached(spec, true)
		l.vol(spec.Name).foundDevice = true
		l.queue.add(spec.Name)
		l.logger.V(2).Info("Found a VolumeAttachment of this node from an earlier run with nothing on disk; it is detached unless a pod wants its volume", "volume", spec.Name, "volumeAttachment", va.Name)
	}
}
