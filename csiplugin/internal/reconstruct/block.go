package reconstruct

import (
	"path"

	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// blockPublish is a raw block volume's publish for one pod.
type blockPublish struct{ specName, podUID string }

// blockPublishes finds the raw block volumes published for pods whose
// symlink is gone (w.linked are those found through one): nodevol stopped
// between the unmap, which removes the symlink, and NodeUnpublishVolume,
// or during a publish. Each publish path, and each record of one (the
// driver may hold a publish whose target it has not created), becomes an
// Uncertain pod mount, so that it is unpublished when no pod wants it, and
// published and mapped again when one does; and its device an Uncertain
// one, unstaged only after it. A symlink in the way is not followed, and a
// record of another boot whose publish path is gone stands for nothing.
func (w *rebuild) blockPublishes() {
	for p := range w.scan.BlockPublishes() {
		w.blockPublish(blockPublish{specName: p.SpecName, podUID: p.PodUID}, p.Record)
	}
	for _, rec := range w.scan.BlockPublishRecords() {
		switch {
		case w.rc.BootID != "" && rec.BootID != "" && rec.BootID != w.rc.BootID:
			continue // rebooted: nothing is published any more; removeOrphanRecords removes it
		case rec.Phase != ondisk.PhasePublishing:
			// A publish that completed, or an unpublish, whose target is
			// gone: a driver creates the target of a block publish, so the
			// publish was undone since (by the kubelet after a hand-over,
			// which leaves nodevol's records). removeOrphanRecords removes
			// it; only a publish in flight may have no target yet.
			continue
		}
		w.scan.MarkSeen(rec.Dir)
		p := blockPublish{specName: path.Base(path.Dir(rec.Dir)), podUID: rec.PodUID}
		w.blockPublish(p, rec)
	}
}

// blockPublish adds p's pod mount (and its device) unless it is known
// already. Its volume is what vol_data.json tells, or the record when that
// cannot be read.
func (w *rebuild) blockPublish(p blockPublish, rec *ondisk.Record) {
	if w.linked[p] {
		return
	}
	w.linked[p] = true
	w.out.Attempted++
	uid := types.UID(p.podUID)
	if _, err := ondisk.BlockVolumePaths(w.root, p.specName, uid); err != nil {
		w.logger.Error(err, "Ignoring a block publish path that nodevol does not name", "podUID", uid, "specName", p.specName)
		return
	}
	v := w.scan.ReadBlockVolume(p.specName, uid)
	var spec podvol.VolumeSpec
	switch {
	case v.Err == nil:
		spec = reconstructedBlockSpec(p.specName, v.Data)
	case rec != nil && rec.PodUID == p.podUID && rec.VolumeHandle != "":
		w.logger.Error(v.Err, "Cannot read the block volume's vol_data.json; reconstructing its publish from nodevol's record", "podUID", uid, "path", v.Paths.PublishPath)
		spec = reconstructedBlockSpec(p.specName, &ondisk.VolumeData{DriverName: rec.Driver, VolumeHandle: rec.VolumeHandle})
	default:
		w.logger.Error(v.Err, "Cannot reconstruct the publish of a block volume, leaving it alone; the volume is not unstaged while it is there", "podUID", uid, "specName", p.specName)
		return
	}
	if rec != nil && !rec.Phase.Done() {
		w.logger.Info("A call was in flight when nodevol stopped; it is repeated if the volume is wanted and undone if not",
			"path", v.Paths.PublishPath, "call", rec.Phase.Call(), "driver", rec.Driver, "volumeHandle", rec.VolumeHandle)
	}
	vol := podvol.PodVolume{Pod: podvol.PodRef{UID: uid}, SpecName: spec.PVName, PVName: spec.PVName}
	w.out.Mounts = append(w.out.Mounts, volume.FoundMount{Spec: spec, Volume: vol, Path: v.Paths.PodDevicePath, State: podvol.Uncertain})
	if !w.found[spec.Name] {
		w.out.Devices = append(w.out.Devices, volume.FoundDevice{Spec: spec, Path: v.Paths.StagingPath, State: podvol.Uncertain})
	}
	w.found[spec.Name] = true
	w.logger.V(2).Info("Reconstructed a block volume published for a pod without its symlink", "podUID", uid, "volume", spec.Name, "driver", spec.Driver, "path", v.Paths.PublishPath)
}
