package volumemanager

import (
	"io/fs"
	"path"
	"path/filepath"

	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/cache"
	"github.com/nodevol/nodevol/csiplugin"
	"github.com/nodevol/nodevol/util/fsutil"
)

// blockPublishDir is where raw block volumes are published, one directory
// per spec name and one entry per pod in it (csiplugin.BlockVolumePaths).
const blockPublishDir = "plugins/kubernetes.io/csi/volumeDevices/publish"

// blockPublish is a raw block volume's publish for one pod.
type blockPublish struct{ specName, podUID string }

// blockPublishes finds the raw block volumes published for pods whose
// symlink is gone (linked are those found through one): nodevol stopped
// between the unmap, which removes the symlink, and NodeUnpublishVolume,
// or during a publish. Each publish path, and each record of one (the
// driver may hold a publish whose target it has not created), becomes an
// Uncertain pod mount, so that it is unpublished when no pod wants it, and
// published and mapped again when one does; and its device an Uncertain
// one, unstaged only after it. A symlink in the way is not followed, and a
// record of another boot whose publish path is gone stands for nothing.
func (w walker) blockPublishes(out *diskState, found map[cache.UniqueVolumeName]bool, linked map[blockPublish]bool) {
	for _, specName := range w.dirs(blockPublishDir) {
		dir := path.Join(blockPublishDir, specName)
		list, err := w.r.ReadDir(dir)
		if err != nil {
			w.refused(err, dir)
			continue
		}
		for _, e := range list {
			rel := path.Join(dir, e.Name())
			if e.Type()&fs.ModeSymlink != 0 {
				w.logger.Info("Ignoring a symlink where a publish path is expected: symlinks under the root are not followed", "path", filepath.Join(w.root, rel))
				continue
			}
			w.blockPublish(out, found, linked, blockPublish{specName: specName, podUID: e.Name()}, w.record(rel))
		}
	}
	for _, rec := range w.blockPublishRecords() {
		p := blockPublish{specName: path.Base(path.Dir(rec.Dir)), podUID: rec.PodUID}
		switch {
		case w.rc.bootID != "" && rec.BootID != "" && rec.BootID != w.rc.bootID:
			continue // rebooted: nothing is published any more; removeOrphanRecords removes it
		case rec.Phase != csiplugin.PhasePublishing:
			// A publish that completed, or an unpublish, whose target is
			// gone: a driver creates the target of a block publish, so the
			// publish was undone since (by the kubelet after a hand-over,
			// which leaves nodevol's records). removeOrphanRecords removes
			// it; only a publish in flight may have no target yet.
			continue
		}
		w.seen[path.Base(csiplugin.RecordFile(rec.Dir))] = true
		w.blockPublish(out, found, linked, p, rec)
	}
}

// blockPublish adds p's pod mount (and its device) unless it is known
// already. Its volume is what vol_data.json tells, or the record when that
// cannot be read.
func (w walker) blockPublish(out *diskState, found map[cache.UniqueVolumeName]bool, linked map[blockPublish]bool, p blockPublish, rec *csiplugin.Record) {
	if linked[p] {
		return
	}
	linked[p] = true
	out.attempted++
	uid := types.UID(p.podUID)
	if _, err := csiplugin.BlockVolumePaths(w.root, p.specName, uid); err != nil {
		w.logger.Error(err, "Ignoring a block publish path that nodevol does not name", "podUID", uid, "specName", p.specName)
		return
	}
	spec, paths, err := reconstructBlock(w.r, w.root, p.specName, uid)
	if err != nil && rec != nil && rec.PodUID == p.podUID && rec.VolumeHandle != "" {
		w.logger.Error(err, "Cannot read the block volume's vol_data.json; reconstructing its publish from nodevol's record", "podUID", uid, "path", paths.PublishPath)
		spec = cache.VolumeSpec{
			Name: cache.CSIVolumeName(rec.Driver, rec.VolumeHandle), PVName: p.specName,
			Driver: rec.Driver, VolumeHandle: rec.VolumeHandle, Mode: cache.Block,
		}
		err = nil
	}
	if err != nil {
		w.logger.Error(err, "Cannot reconstruct the publish of a block volume, leaving it alone; the volume is not unstaged while it is there", "podUID", uid, "specName", p.specName)
		return
	}
	if rec != nil && !rec.Phase.Done() {
		w.logger.Info("A call was in flight when nodevol stopped; it is repeated if the volume is wanted and undone if not",
			"path", paths.PublishPath, "call", rec.Phase.Call(), "driver", rec.Driver, "volumeHandle", rec.VolumeHandle)
	}
	vol := cache.PodVolume{Pod: cache.PodRef{UID: uid}, SpecName: spec.PVName}
	out.mounts = append(out.mounts, foundMount{spec: spec, vol: vol, path: paths.PodDevicePath, state: cache.Uncertain})
	if !found[spec.Name] {
		out.devices = append(out.devices, foundDevice{spec: spec, path: paths.StagingPath, state: cache.Uncertain})
	}
	found[spec.Name] = true
	w.logger.V(2).Info("Reconstructed a block volume published for a pod without its symlink", "podUID", uid, "volume", spec.Name, "driver", spec.Driver, "path", paths.PublishPath)
}

// blockPublishRecords are the records of raw block publish paths that the
// walk has not seen: those whose publish path is gone, or was not created.
func (w walker) blockPublishRecords() []*csiplugin.Record {
	var out []*csiplugin.Record
	for _, shard := range w.dirs(csiplugin.RecordsDir) {
		dir := path.Join(csiplugin.RecordsDir, shard)
		list, err := w.r.ReadDir(dir)
		if err != nil {
			w.refused(err, dir)
			continue
		}
		for _, e := range list {
			if w.seen[e.Name()] || !e.Type().IsRegular() {
				continue
			}
			name := path.Join(dir, e.Name())
			var rec csiplugin.Record
			if fsutil.ReadJSONIn(w.r, name, &rec) != nil || csiplugin.RecordFile(rec.Dir) != name {
				continue // removeOrphanRecords logs it
			}
			// Only a record this nodevol can read (csiplugin.ReadRecord's
			// checks) of a publish path named as BlockVolumePaths names it.
			specName := path.Base(path.Dir(rec.Dir))
			if rec.Mode != string(cache.Block) || rec.PodUID == "" || path.Base(rec.Dir) != rec.PodUID ||
				path.Dir(path.Dir(rec.Dir)) != blockPublishDir || fsutil.ValidateName("spec name", specName) != nil ||
				rec.Version < 1 || rec.Version > csiplugin.RecordVersion || rec.Driver == "" || rec.VolumeHandle == "" || rec.Phase.Call() == "" {
				continue
			}
			out = append(out, &rec)
		}
	}
	return out
}
