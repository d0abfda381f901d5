package volumemanager

import (
	"context"
	"errors"
	"io/fs"
	"path/filepath"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/cache"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/internal/rootfs"
	"github.com/nodevol/nodevol/util/step"
)

// lifecycleEphemeral is vol_data.json's volumeLifecycleMode of an inline volume.
const lifecycleEphemeral = "Ephemeral"

// diskState is what reconstruction found on disk: plain data that the loop
// installs as its initial actual state.
type diskState struct {
	// mounts are pod mounts (Uncertain), devices staged devices (Uncertain).
	mounts  []foundMount
	devices []foundDevice
	// unreadable are the pod volume directories (and block symlinks)
	// whose vol_data.json cannot be read: each may hold the mount of the
	// PV it is named after (the kubelet names a PV's pod directory after
	// the PV).
	unreadable []string
	// attempted counts the pod volumes (and block symlinks) found: those
	// reconstructed, those unreadable and the leftovers of a reboot.
	attempted int
}

type foundMount struct {
	spec  cache.VolumeSpec
	vol   cache.PodVolume
	path  string
	state cache.MountState // Mounted or Uncertain
}

type foundDevice struct {
	spec  cache.VolumeSpec
	path  string
	state cache.MountState // Mounted or Uncertain
	// seLinuxContext is the SELinux context vol_data.json says the device
	// was staged with.
	seLinuxContext string
}

// recovery is what reconstruction compares nodevol's records of work in
// flight (ondisk.Record) with.
type recovery struct {
	// bootID is this boot's ID; "" when unknown: no record is then taken
	// for one of another boot.
	bootID string
	// mountPoints are the mount points of the node (from the mount
	// table); nil when they could not be listed: no volume is then
	// trusted as Mounted, and no reboot leftover is removed.
	mountPoints map[string]bool
	// steps sees each change reconstruction's clean-up makes (Config.Steps).
	steps step.Hook
}

// reconstruct adds the CSI volumes a previous run left on disk to the actual
// state, as the kubelet's reconstruction does, so that they are torn down
// when no pod wants them and re-published (idempotently) when one does:
// each pod volume directory with a vol_data.json becomes an Uncertain pod
// mount, each staging directory with a vol_data.json an Uncertain device;
// raw block volumes likewise, from their pod symlinks, their publishes left
// without a symlink (blockPublishes) and their data directories.
// Nothing is trusted as Mounted and nothing is removed here. A directory
// whose vol_data.json is missing or corrupt is logged and left alone:
// without it nodevol cannot tell which driver and volume it belongs to.
//
// The exceptions are what nothing else would ever remove and what cannot
// hold data: the leftovers of a reboot (recover), and a pod volume or
// staging directory without a readable vol_data.json (nor a record to
// stand in for it) that holds nothing (ondisk.RemoveUnusedVolumeDir),
// as a stop between creating it and writing vol_data.json leaves it. Left,
// such a pod volume directory would hold the device of the PV it is named
// after staged for good.
//
// The scan (ondisk.Scanner) reads what is there; what to make of it is
// decided here. It follows no symlink below root (internal/rootfs): a symlink where a
// directory is expected (a pod's directory, its volumes or
// kubernetes.io~csi directory, a volume directory, a driver's or a staging
// directory) is logged and skipped, so that nothing it points to is ever
// reconstructed, and so never torn down.
func reconstruct(ctx context.Context, root string, rc recovery) diskState {
	logger := klog.FromContext(ctx)
	r, err := rootfs.New(root)
	if err != nil {
		logger.Error(err, "Cannot reconstruct volumes", "rootDir", root)
		return diskState{}
	}
	r = r.WithSteps(rc.steps)
	w := &rebuild{
		walker: walker{logger: logger, r: r, root: root, rc: rc, scan: ondisk.NewScanner(logger, r, root)},
		found:  map[cache.UniqueVolumeName]bool{},
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
	out diskState
	// found are the volumes found so far: a device is added once.
	found map[cache.UniqueVolumeName]bool
	// linked are the block publishes found so far (blockPublishes).
	linked map[blockPublish]bool
}

// podVolume reconstructs a pod volume directory from its vol_data.json, or
// from its record when that cannot be read; one that has neither and holds
// nothing is removed, any other is left alone and listed as unreadable.
func (w *rebuild) podVolume(v ondisk.PodVolume) {
	w.out.attempted++
	var spec cache.VolumeSpec
	var vol cache.PodVolume
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
		w.out.unreadable = append(w.out.unreadable, v.Dir)
		return
	}
	state, ok := w.recover(v.Rel, ondisk.PublishLeaf, v.Record)
	if !ok {
		return // a reboot's leftover, removed: nothing to tear down
	}
	w.out.mounts = append(w.out.mounts, foundMount{spec: spec, vol: vol, path: filepath.Join(v.Dir, ondisk.PublishLeaf), state: state})
	if !spec.Ephemeral && !w.found[spec.Name] {
		if d, ok := w.stagedDevice(spec); ok {
			w.out.devices = append(w.out.devices, d)
		}
	}
	w.found[spec.Name] = true
	w.logger.V(2).Info("Reconstructed pod volume", "podUID", v.PodUID, "volume", spec.Name, "driver", spec.Driver, "path", v.Dir)
}

// blockLink reconstructs a raw block volume from a pod's symlink to it.
func (w *rebuild) blockLink(l ondisk.BlockLink) {
	w.linked[blockPublish{specName: l.SpecName, podUID: string(l.PodUID)}] = true
	w.out.attempted++
	if l.Volume.Err != nil {
		w.logger.Error(l.Volume.Err, "Cannot reconstruct block volume, leaving it alone", "podUID", l.PodUID, "path", l.Path)
		w.out.unreadable = append(w.out.unreadable, l.Path)
		return
	}
	spec, paths := blockSpec(l.SpecName, l.Volume.Data), l.Volume.Paths
	w.logInFlight(paths.PublishPath)
	vol := cache.PodVolume{Pod: cache.PodRef{UID: l.PodUID}, SpecName: spec.PVName}
	w.out.mounts = append(w.out.mounts, foundMount{spec: spec, vol: vol, path: paths.PodDevicePath, state: cache.Uncertain})
	if !w.found[spec.Name] {
		w.out.devices = append(w.out.devices, foundDevice{spec: spec, path: paths.StagingPath, state: cache.Uncertain})
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
	spec, paths := blockSpec(d.SpecName, d.Volume.Data), d.Volume.Paths
	w.logInFlight(paths.StagingPath)
	if !w.found[spec.Name] {
		w.out.devices = append(w.out.devices, foundDevice{spec: spec, path: paths.StagingPath, state: cache.Uncertain})
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
	spec := cache.VolumeSpec{Name: cache.CSIVolumeName(data.DriverName, data.VolumeHandle), PVName: data.SpecVolID, Driver: data.DriverName, VolumeHandle: data.VolumeHandle, Mode: cache.Filesystem}
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
		w.out.devices = append(w.out.devices, d)
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
	rc     recovery
	scan   *ondisk.Scanner
}

// blockSpec is what a block volume's vol_data.json tells of it.
func blockSpec(specName string, d *ondisk.VolumeData) cache.VolumeSpec {
	return cache.VolumeSpec{
		Name: cache.CSIVolumeName(d.DriverName, d.VolumeHandle), PVName: specName,
		Driver: d.DriverName, VolumeHandle: d.VolumeHandle, Mode: cache.Block,
	}
}

// stagedDevice returns spec's device if its staging directory exists (and
// is a directory, not a symlink) and was not left by a reboot.
func (w walker) stagedDevice(spec cache.VolumeSpec) (foundDevice, bool) {
	st, ok := w.scan.Staged(string(spec.Name), spec.Driver, spec.VolumeHandle, spec.PVName)
	if !ok {
		return foundDevice{}, false
	}
	state, ok := w.recover(st.Rel, ondisk.StagingLeaf, st.Record)
	if !ok {
		return foundDevice{}, false
	}
	d := foundDevice{spec: spec, path: st.StagingPath, state: state}
	if st.Data != nil {
		d.seLinuxContext = st.Data.SELinuxMountContext
	}
	return d, true
}

// removeUnused removes volume directory rel (with leaf "mount" or
// "globalmount") if nothing in it can hold data
// (ondisk.RemoveUnusedVolumeDir); the error says why it did not.
func (w walker) removeUnused(rel, leaf string) error {
	if w.rc.mountPoints == nil {
		return errors.New("the mount table is unknown: nothing is removed that may be mounted")
	}
	return ondisk.RemoveUnusedVolumeDir(w.r, func(p string) bool { return w.rc.mountPoints[p] }, rel, leaf)
}

// retakeUnreadable removes pod volume directory dir (absolute), found
// unreadable at start, once nothing in it can hold data any more: what
// made it unreadable (a file nodevol did not write, data in its mount
// directory) is gone, and it would otherwise hold the device of the PV it
// is named after until the next restart. The mount table is read afresh.
// It reports whether dir is gone.
func (vm *VolumeManager) retakeUnreadable(dir string) bool {
	r, err := rootfs.New(vm.cfg.RootDir)
	if err != nil {
		return false
	}
	rel, err := r.Rel(dir)
	if err != nil {
		return false
	}
	mps, err := vm.cfg.Mounter.List()
	if err != nil {
		return false
	}
	mounted := make(map[string]bool, len(mps))
	for _, mp := range mps {
		mounted[mp.Path] = true
	}
	w := walker{r: r.WithSteps(vm.cfg.Steps), root: vm.cfg.RootDir, rc: recovery{mountPoints: mounted}}
	if err := w.removeUnused(rel, "mount"); err != nil {
		return false
	}
	vm.loop.logger.Info("Removed a pod volume directory found unreadable at start: it holds nothing any more", "path", dir)
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
func (w walker) recover(rel, leaf string, rec *ondisk.Record) (state cache.MountState, ok bool) {
	if rec == nil {
		return cache.Uncertain, true
	}
	leafPath := filepath.Join(w.root, rel, leaf)
	mounted := w.rc.mountPoints[leafPath]
	logger := w.logger.WithValues("path", filepath.Join(w.root, rel), "phase", rec.Phase, "driver", rec.Driver, "volumeHandle", rec.VolumeHandle)
	switch {
	case w.rc.bootID != "" && rec.BootID != "" && rec.BootID != w.rc.bootID:
		if w.rc.mountPoints == nil || mounted {
			logger.Info("Record of an earlier boot, but the mount table is unknown or still shows the mount; recovering it as Uncertain", "recordBootID", rec.BootID, "mounted", mounted)
			return cache.Uncertain, true
		}
		err := ondisk.RemoveUnusedVolumeDir(w.r, func(p string) bool { return w.rc.mountPoints[p] }, rel, leaf)
		if err != nil {
			logger.Error(err, "The node rebooted since the record was written, but its directory may hold data; recovering it as Uncertain")
			return cache.Uncertain, true
		}
		logger.Info("The node rebooted since the record was written: nothing is mounted any more; removed the directory's leftovers", "recordBootID", rec.BootID)
		return cache.NotMounted, false
	case rec.Phase.Done() && mounted:
		logger.V(2).Info("Recovered as Mounted from nodevol's record")
		return cache.Mounted, true
	case !rec.Phase.Done():
		logger.Info("A call was in flight when nodevol stopped; it is repeated if the volume is wanted and undone if not", "call", rec.Phase.Call())
	default:
		// A driver may publish without a mount of its own; the call is
		// repeated, as the kubelet repeats it for every volume it finds.
		logger.V(2).Info("Recorded as done, but not a mount point; recovering it as Uncertain", "call", rec.Phase.Call())
	}
	return cache.Uncertain, true
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
func reconstructedSpec(d *ondisk.VolumeData, uid types.UID, dirName string) (cache.VolumeSpec, cache.PodVolume) {
	spec := cache.VolumeSpec{Driver: d.DriverName, VolumeHandle: d.VolumeHandle, Mode: cache.Filesystem}
	vol := cache.PodVolume{Pod: cache.PodRef{UID: uid}, SpecName: dirName, SELinuxLabel: d.SELinuxMountContext}
	if d.VolumeLifecycleMode == lifecycleEphemeral {
		spec.Ephemeral = true
		spec.Name = inlineVolumeName(uid, dirName)
	} else {
		spec.Name = cache.CSIVolumeName(d.DriverName, d.VolumeHandle)
		spec.PVName = dirName // the kubelet names a PV's pod directory after the PV
	}
	return spec, vol
}
