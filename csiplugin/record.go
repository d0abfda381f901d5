package csiplugin

import (
	"github.com/nodevol/nodevol/csi"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/podvol"
)

// volumeRecord is the record of spec's directory dir.
func volumeRecord(spec *podvol.VolumeSpec, dir string, publishContext map[string]string, caps csi.Capabilities) *ondisk.Record {
	rec := &ondisk.Record{
		Dir: dir, Driver: spec.Driver, VolumeHandle: spec.VolumeHandle, PVName: spec.PVName,
		Ephemeral: spec.Ephemeral, Mode: string(spec.Mode), FSType: spec.FSType,
		MountOptions: spec.MountOptions, ReadOnly: spec.ReadOnly, PublishContext: publishContext,
		AccessMode:     caps.AccessMode(spec.AccessMode).String(),
		StageSecretRef: secretRef(spec.NodeStageSecret), PublishSecretRef: secretRef(spec.NodePublishSecret),
	}
	if rec.Mode == "" {
		rec.Mode = string(podvol.Filesystem)
	}
	return rec
}

func secretRef(s *podvol.SecretRef) *ondisk.RecordSecretRef {
	if s == nil {
		return nil
	}
	return &ondisk.RecordSecretRef{Namespace: s.Namespace, Name: s.Name}
}

// podRecord is the record of a pod's volume directory dir.
func (p *plugin) podRecord(spec *podvol.VolumeSpec, vol podvol.PodVolume, dir string, publishContext map[string]string, caps csi.Capabilities, publishSecret *podvol.SecretRef) *ondisk.Record {
	rec := volumeRecord(spec, dir, publishContext, caps)
	rec.PodUID, rec.PodNamespace, rec.PodName = string(vol.Pod.UID), vol.Pod.Namespace, vol.Pod.Name
	rec.SpecName = ondisk.VolumeDirName(spec, vol)
	rec.ReadOnly = vol.ReadOnly || spec.ReadOnly
	rec.PublishSecretRef = secretRef(publishSecret)
	return rec
}
