// Package reconstruct finds the CSI volumes that earlier runs (nodevol's
// or the kubelet's) left on disk, and the state each was left in.
//
// The scan (ondisk.Scanner) reads what is there; what to make of it is
// decided here, for the CSI plugin's Reconstruct and Retake
// (volume.Reconstructor). Paths are reached through the root the caller
// holds (internal/rootfs): nothing is followed through a symlink below it.
package reconstruct

import (
	"context"
	"errors"
	"io/fs"
	"path/filepath"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/internal/rootfs"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// lifecycleEphemeral is vol_data.json's volumeLifecycleMode of an inline volume.
const lifecycleEphemeral = "Ephemeral"

// inlineVolumeName is the unique name of a pod's inline CSI volume, the
// kubelet's: {plugin}/{podUID}-{specName}.
func inlineVolumeName(uid types.UID, specName string) podvol.UniqueVolumeName {
	return podvol.UniqueVolumeName(podvol.CSIPluginName + "/" + string(uid) + "-" + specName)
}

// Find returns the CSI volumes earlier runs (nodevol's or the kubelet's)
// left under root (r is root, held by the caller for the whole scan), as
// the kubelet's reconstruction finds them, so that they are torn down
// when no pod wants them and re-published (idempotently) when one does:
// each pod volume directory with a vol_data.json becomes a pod mount, each
// staging directory with a vol_data.json a device, Uncertain unless
// nodevol's record of this boot says its call completed and its leaf is
// still a mount point (recover); raw block volumes likewise, always
// Uncertain, from their pod symlinks, their publishes left without a
// symlink (blockPublishes) and their data directories. (The kubelet
// v1.37.2 trusts nothing it reconstructs: every volume it finds is
// Uncertain.) Nothing is removed here. A directory whose vol_data.json is
// missing or corrupt is logged and left alone: without it nodevol cannot
// tell which driver and volume it belongs to.
//
// The exceptions are what nothing else would ever remove and what cannot
// hold data: the leftovers of a reboot (recover), and a pod volume or
// staging directory without a readable vol_data.json (nor a record to
// stand in for it) that holds nothing (ondisk.RemoveUnusedVolumeDir),
// as a stop between creating it and writing vol_data.json leaves it. Left,
// such a pod volume directory would hold the device of the PV it is named
// after staged for good.
//
// It follows no symlink below root: a symlink where a
// directory is expected (a pod's directory, its volumes or
// kubernetes.io~csi directory, a volume directory, a driver's or a staging
// directory) is logged and skipped, so that nothing it points to is ever
// reconstructed, and so never torn down.
func Find(ctx context.Context, r *rootfs.Root, root string, rc volume.Recovery) volume.Found {
	logger := klog.FromContext(ctx)
	w := &rebuild{
		walker: walker{logger: logger, r: r, root: root, rc: rc, scan: ondisk.NewScanner(logger, r, root)},
		found:  map[podvol.UniqueVolumeName]bool{},
		linked: map[blockPublish]bool{},
	}
	pods := w.scan.Pods()
	for v := range w.scan.PodVolumes(pods) {
		w.podVolume(v)
	}
	// Raw block volumes: the pod's symlink, the publishes left without
	// one, the volume's data directory.
	for l := range w.scan.BlockLinks(pods) {
		w.blockLink(l)
	}
	w.blockPublishes()
	for d := range w.scan.BlockDirs() {
		w.blockDir(d)
	}
	// Staged volumes whose pods are gone (a stop between unpublish and
	// unstage) are found through their staging directories.
	for e := range w.scan.StagingDirs() {
		w.stagingDir(e)
	}
	w.removeOrphanRecords()
	return w.out
}

// rebuild is one reconstruction: the walker and what it found so far.
type rebuild struct {
	walker
	out volume.Found
	// found are the volumes found so far: a device is added once.
	found map[podvol.UniqueVolumeName]bool
	// linked are the block publishes found so far (blockPublishes).
	linked map[blockPublish]bool
}

// podVolume reconstructs a pod volume directory from its vol_data.json, or
// from its record when that cannot be read; one that has neither and holds
// nothing is removed, any other is left alone and listed as unreadable.
func (w *rebuild) podVolume(v ondisk.PodVolume) {
	w.out.Attempted++
	var spec podvol.VolumeSpec
	var vol podvol.PodVolume
	switch rec := v.Record; {
	case v.DataErr == nil:
		spec, vol = reconstructedSpec(v.Data, v.PodUID, v.Name)
	case rec != nil && rec.PodUID == string(v.PodUID) && rec.SpecName == v.Name:
		// The record knows the volume as well as vol_data.json would.
		w.logger.Error(v.DataErr, "Cannot read vol_data.json; reconstructing the pod volume from nodevol's record", "podUID", v.PodUID, "path", v.Dir)
		spec, vol = reconstructedSpec(recordVolumeData(rec), v.PodUID, v.Name)
	default:
		// A directory that cannot hold data (SetUp stopped before
		// vol_data.json) would hold the device for good: it goes.
		rerr := w.removeUnused(v.Rel, ondisk.PublishLeaf)
		if rerr == nil {
			w.logger.Info("Removed a pod volume directory without vol_data.json that holds nothing", "podUID", v.PodUID, "path", v.Dir, "err", v.DataErr.Error())
			return
		}
		w.logger.Error(v.DataErr, "Cannot reconstruct pod volume, leaving it alone; the staged device of the PV it names is not unstaged while it is there", "podUID", v.PodUID, "path", v.Dir, "notRemoved", rerr.Error())
		w.out.Unreadable = append(w.out.Unreadable, v.Dir)
		return
	}
	state, ok := w.recover(v.Rel, ondisk.PublishLeaf, v.Record)
	if !ok {
		return // a reboot's leftover, removed: nothing to tear down
	}
	w.out.Mounts = append(w.out.Mounts, volume.FoundMount{Spec: spec, Volume: vol, Path: filepath.Join(v.Dir, ondisk.PublishLeaf), State: state})
	if !spec.Ephemeral && !w.found[spec.Name] {
		if d, ok := w.stagedDevice(spec); ok {
			w.out.Devices = append(w.out.Devices, d)
		}
	}
	w.found[spec.Name] = true
	w.logger.V(2).Info("Reconstructed pod volume", "podUID", v.PodUID, "volume", spec.Name, "driver", spec.Driver, "path", v.Dir)
}

// blockLink reconstructs a raw block volume from a pod's symlink to it.
func (w *rebuild) blockLink(l ondisk.BlockLink) {
	w.linked[blockPublish{specName: l.SpecName, podUID: string(l.PodUID)}] = true
	w.out.Attempted++
	if l.Volume.Err != nil {
		w.logger.Error(l.Volume.Err, "Cannot reconstruct block volume, leaving it alone", "podUID", l.PodUID, "path", l.Path)
		w.out.Unreadable = append(w.out.Unreadable, l.Path)
		return
	}
	spec, paths := reconstructedBlockSpec(l.SpecName, l.Volume.Data), l.Volume.Paths
	w.logInFlight(paths.PublishPath)
	vol := podvol.PodVolume{Pod: podvol.PodRef{UID: l.PodUID}, SpecName: spec.PVName, PVName: spec.PVName}
	w.out.Mounts = append(w.out.Mounts, volume.FoundMount{Spec: spec, Volume: vol, Path: paths.PodDevicePath, State: podvol.Uncertain})
	if !w.found[spec.Name] {
		w.out.Devices = append(w.out.Devices, volume.FoundDevice{Spec: spec, Path: paths.StagingPath, State: podvol.Uncertain})
	}
	w.found[spec.Name] = true
	w.logger.V(2).Info("Reconstructed block volume", "podUID", l.PodUID, "volume", spec.Name, "driver", spec.Driver, "path", l.Path)
}

// blockDir reconstructs a staged raw block volume from its data
// directory; one without vol_data.json that holds nothing is removed.
func (w *rebuild) blockDir(d ondisk.BlockDir) {
	if !d.HasData {
		w.removeBlockLeftover(d)
		return
	}
	if d.Volume.Err != nil {
		w.logger.Error(d.Volume.Err, "Cannot reconstruct block volume, leaving it alone", "path", d.DataFile)
		return
	}
	spec, paths := reconstructedBlockSpec(d.SpecName, d.Volume.Data), d.Volume.Paths
	w.logInFlight(paths.StagingPath)
	if !w.found[spec.Name] {
		w.out.Devices = append(w.out.Devices, volume.FoundDevice{Spec: spec, Path: paths.StagingPath, State: podvol.Uncertain})
		w.found[spec.Name] = true
		w.logger.V(2).Info("Reconstructed staged block volume", "volume", spec.Name, "driver", spec.Driver)
	}
}

// stagingDir reconstructs a staged volume from its staging directory, at
// the path nodevol itself would use for what its vol_data.json (or its
// record) names, or an older kubelet's legacy one.
func (w *rebuild) stagingDir(e ondisk.StagingDirEntry) {
	if !e.HasData {
		w.removeStagingLeftover(e)
		return
	}
	data := e.Data
	if e.DataErr != nil {
		rec := w.scan.Record(e.Rel)
		if rec == nil || rec.PodUID != "" {
			w.logger.Error(e.DataErr, "Cannot reconstruct staged volume, leaving it alone", "path", e.Dir)
			return
		}
		w.logger.Error(e.DataErr, "Cannot read vol_data.json; reconstructing the staged volume from nodevol's record", "path", e.Dir)
		data = recordVolumeData(rec)
	}
	spec := podvol.VolumeSpec{Name: podvol.CSIVolumeName(data.DriverName, data.VolumeHandle), PVName: data.SpecVolID, Driver: data.DriverName, VolumeHandle: data.VolumeHandle, Mode: podvol.Filesystem}
	if w.found[spec.Name] {
		return
	}
	want, err := ondisk.StagingDir(w.root, spec.Driver, spec.VolumeHandle)
	if legacy, lerr := ondisk.LegacyStagingDir(w.root, e.Name); e.Driver == "pv" && want != e.Dir && lerr == nil && legacy == e.Dir {
		// Staged by an older kubelet, by PV name (its vol_data.json
		// has no specVolID): stagedDevice finds it there.
		spec.PVName, want, err = e.Name, e.Dir, nil
	}
	// Only a directory at the path nodevol itself would use is its own.
	if err != nil || want != e.Dir {
		w.logger.Error(err, "Staging directory does not match its vol_data.json, leaving it alone", "path", e.Dir, "driver", spec.Driver)
		return
	}
	if d, ok := w.stagedDevice(spec); ok {
		w.out.Devices = append(w.out.Devices, d)
		w.found[spec.Name] = true
		w.logger.V(2).Info("Reconstructed staged volume", "volume", spec.Name, "driver", spec.Driver, "path", e.Dir)
	}
}

// walker makes reconstruction's decisions on what the scan finds: the
// state a volume was left in, and the removal of what cannot hold data.
type walker struct {
	logger klog.Logger
	r      *rootfs.Root
	root   string // as given: the paths found are built on it
	rc     volume.Recovery
	scan   *ondisk.Scanner
}

// reconstructedBlockSpec is what a block volume's vol_data.json tells of it.
func reconstructedBlockSpec(specName string, d *ondisk.VolumeData) podvol.VolumeSpec {
	return podvol.VolumeSpec{
		Name: podvol.CSIVolumeName(d.DriverName, d.VolumeHandle), PVName: specName,
		Driver: d.DriverName, VolumeHandle: d.VolumeHandle, Mode: podvol.Block,
	}
}

// stagedDevice returns spec's device if its staging directory exists (and
// is a directory, not a symlink) and was not left by a reboot.
func (w walker) stagedDevice(spec podvol.VolumeSpec) (volume.FoundDevice, bool) {
	st, ok := w.scan.Staged(string(spec.Name), spec.Driver, spec.VolumeHandle, spec.PVName)
	if !ok {
		return volume.FoundDevice{}, false
	}
	state, ok := w.recover(st.Rel, ondisk.StagingLeaf, st.Record)
	if !ok {
		return volume.FoundDevice{}, false
	}
	d := volume.FoundDevice{Spec: spec, Path: st.StagingPath, State: state}
	if st.Data != nil {
		d.SELinuxContext = st.Data.SELinuxMountContext
	}
	return d, true
}

// removeUnused removes volume directory rel (with leaf "mount" or
// "globalmount") if nothing in it can hold data
// (ondisk.RemoveUnusedVolumeDir); the error says why it did not.
func (w walker) removeUnused(rel, leaf string) error {
	if w.rc.MountPoints == nil {
		return errors.New("the mount table is unknown: nothing is removed that may be mounted")
	}
	return ondisk.RemoveUnusedVolumeDir(w.r, func(p string) bool { return w.rc.MountPoints[p] }, rel, leaf)
}

// Retake removes pod volume directory dir (absolute, under r's root),
// found unreadable at start, once nothing in it can hold data any more
// (mounted is the mount table's mount points): what made it unreadable (a
// file nodevol did not write, data in its mount directory) is gone, and it
// would otherwise hold the device of the PV it is named after until the
// next restart. It reports whether it removed it.
func Retake(ctx context.Context, r *rootfs.Root, dir string, mounted map[string]bool) bool {
	rel, err := r.Rel(dir)
	if err != nil {
		return false
	}
	w := walker{r: r, rc: volume.Recovery{MountPoints: mounted}}
	if err := w.removeUnused(rel, ondisk.PublishLeaf); err != nil {
		return false
	}
	klog.FromContext(ctx).Info("Removed a pod volume directory found unreadable at start: it holds nothing any more", "path", dir)
	return true
}

// removeStagingLeftover removes a staging directory without vol_data.json
// that MountDevice created but a stop cut short before it wrote
// vol_data.json: nothing reconstructs it, so nothing else would ever
// remove it. One that may hold data is logged and left.
func (w walker) removeStagingLeftover(e ondisk.StagingDirEntry) {
	if !ondisk.IsStagingDirName(e.Driver, e.Name) {
		return
	}
	w.scan.RemoveWriteLeftovers(e.Rel)
	if err := w.removeUnused(e.Rel, ondisk.StagingLeaf); err != nil {
		w.logger.Error(err, "Staging directory without vol_data.json, leaving it alone", "path", e.Dir, "driver", e.Driver)
		return
	}
	w.logger.Info("Removed a staging directory without vol_data.json that holds nothing", "path", e.Dir, "driver", e.Driver)
}

// removeBlockLeftover removes a raw block volume directory that has no
// vol_data.json and holds nothing (ondisk.RemoveUnusedBlockDir): a stop
// cut its creation or its removal short. Anything else is logged and left.
func (w walker) removeBlockLeftover(d ondisk.BlockDir) {
	if err := ondisk.RemoveUnusedBlockDir(w.r, d.SpecName); err != nil {
		w.logger.Error(err, "Block volume directory without vol_data.json, leaving it alone", "path", d.Dir)
		return
	}
	w.logger.Info("Removed a block volume directory without vol_data.json that holds nothing", "path", d.Dir)
}

// recover decides, from its record, in which state a volume directory rel
// (with leaf "mount" or "globalmount") was left:
//
//   - no record (a kubelet's directory, or one nodevol could not record):
//     Uncertain, as the kubelet does;
//   - a record of this boot whose stage or publish completed, with the
//     leaf still a mount point: Mounted, and nothing is called again;
//   - a record of this boot of a call in flight (or a completed one whose
//     mount point is gone): Uncertain, so the call is repeated if the
//     volume is wanted and undone if not;
//   - a record of another boot: the node rebooted and nothing is mounted
//     there any more; the directory's leftovers are removed and ok is
//     false (nothing to tear down; a wanted volume is staged and published
//     afresh). If anything may hold data there, it is Uncertain instead.
func (w walker) recover(rel, leaf string, rec *ondisk.Record) (state podvol.MountState, ok bool) {
	if rec == nil {
		return podvol.Uncertain, true
	}
	leafPath := filepath.Join(w.root, rel, leaf)
	mounted := w.rc.MountPoints[leafPath]
	logger := w.logger.WithValues("path", filepath.Join(w.root, rel), "phase", rec.Phase, "driver", rec.Driver, "volumeHandle", rec.VolumeHandle)
	switch {
	case w.rc.BootID != "" && rec.BootID != "" && rec.BootID != w.rc.BootID:
		if w.rc.MountPoints == nil || mounted {
			logger.Info("Record of an earlier boot, but the mount table is unknown or still shows the mount; recovering it as Uncertain", "recordBootID", rec.BootID, "mounted", mounted)
			return podvol.Uncertain, true
		}
		err := ondisk.RemoveUnusedVolumeDir(w.r, func(p string) bool { return w.rc.MountPoints[p] }, rel, leaf)
		if err != nil {
			logger.Error(err, "The node rebooted since the record was written, but its directory may hold data; recovering it as Uncertain")
			return podvol.Uncertain, true
		}
		logger.Info("The node rebooted since the record was written: nothing is mounted any more; removed the directory's leftovers", "recordBootID", rec.BootID)
		return podvol.NotMounted, false
	case rec.Phase.Done() && mounted:
		logger.V(2).Info("Recovered as Mounted from nodevol's record")
		return podvol.Mounted, true
	case !rec.Phase.Done():
		logger.Info("A call was in flight when nodevol stopped; it is repeated if the volume is wanted and undone if not", "call", rec.Phase.Call())
	default:
		// A driver may publish without a mount of its own; the call is
		// repeated, as the kubelet repeats it for every volume it finds.
		logger.V(2).Info("Recorded as done, but not a mount point; recovering it as Uncertain", "call", rec.Phase.Call())
	}
	return podvol.Uncertain, true
}

// logInFlight logs the call a raw block volume's record (of its staging
// or publish path) says was in flight. Block volumes are recovered as the
// kubelet recovers them, Uncertain whatever the record says: their
// mapping (a bind mount held by a loop device) is not checked here.
func (w walker) logInFlight(abs string) {
	rel, err := w.r.Rel(abs)
	if err != nil {
		return
	}
	if rec := w.scan.Record(rel); rec != nil && !rec.Phase.Done() {
		w.logger.Info("A call was in flight when nodevol stopped; it is repeated if the volume is wanted and undone if not",
			"path", abs, "call", rec.Phase.Call(), "driver", rec.Driver, "volumeHandle", rec.VolumeHandle)
	}
}

// removeOrphanRecords removes the records whose directory no longer
// exists (a stop between removing a volume's directory and its record).
// A record it cannot read, or whose directory is still there, is left.
func (w walker) removeOrphanRecords() {
	for f := range w.scan.UnseenRecords() {
		rec := f.Record
		if rec == nil {
			w.logger.Error(f.Err, "Leaving a record that does not name its directory", "path", filepath.Join(w.root, f.Name))
			continue
		}
		if _, err := w.r.Lstat(rec.Dir); !errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err := w.r.Remove(f.Name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			w.logger.Error(err, "Cannot remove the record of a directory that is gone", "path", filepath.Join(w.root, f.Name))
			continue
		}
		w.logger.V(2).Info("Removed the record of a directory that is gone", "dir", rec.Dir, "phase", rec.Phase)
	}
}

// recordVolumeData is the vol_data.json a record stands for.
func recordVolumeData(rec *ondisk.Record) *ondisk.VolumeData {
	d := &ondisk.VolumeData{SpecVolID: rec.PVName, VolumeHandle: rec.VolumeHandle, DriverName: rec.Driver}
	if rec.Ephemeral {
		d.VolumeLifecycleMode = lifecycleEphemeral
	}
	return d
}

// reconstructedSpec is what vol_data.json tells of a pod's volume: enough
// to tear it down, and the same unique name the populator gives it, so a
// pod that still wants it finds it.
func reconstructedSpec(d *ondisk.VolumeData, uid types.UID, dirName string) (podvol.VolumeSpec, podvol.PodVolume) {
	spec := podvol.VolumeSpec{Driver: d.DriverName, VolumeHandle: d.VolumeHandle, Mode: podvol.Filesystem}
	vol := podvol.PodVolume{Pod: podvol.PodRef{UID: uid}, SpecName: dirName, SELinuxLabel: d.SELinuxMountContext}
	if d.VolumeLifecycleMode == lifecycleEphemeral {
		spec.Ephemeral = true
		spec.Name = inlineVolumeName(uid, dirName)
	} else {
		spec.Name = podvol.CSIVolumeName(d.DriverName, d.VolumeHandle)
		spec.PVName = dirName // the kubelet names a PV's pod directory after the PV
		vol.PVName = dirName
	}
	return spec, vol
}
