package volumemanager

import (
	"context"
	"errors"
	"io/fs"
	"path"
	"path/filepath"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/cache"
	"github.com/nodevol/nodevol/csiplugin"
	"github.com/nodevol/nodevol/util/fsutil"
	"github.com/nodevol/nodevol/util/rootfs"
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
// flight (csiplugin.Record) with.
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
// stand in for it) that holds nothing (csiplugin.RemoveUnusedVolumeDir),
// as a stop between creating it and writing vol_data.json leaves it. Left,
// such a pod volume directory would hold the device of the PV it is named
// after staged for good.
//
// The walk follows no symlink below root (util/rootfs): a symlink where a
// directory is expected (a pod's directory, its volumes or
// kubernetes.io~csi directory, a volume directory, a driver's or a staging
// directory) is logged and skipped, so that nothing it points to is ever
// reconstructed, and so never torn down.
func reconstruct(ctx context.Context, root string, rc recovery) diskState {
	logger := klog.FromContext(ctx)
	var out diskState
	r, err := rootfs.New(root)
	if err != nil {
		logger.Error(err, "Cannot reconstruct volumes", "rootDir", root)
		return out
	}
	r = r.WithSteps(rc.steps)
	w := walker{logger: logger, r: r, root: root, rc: rc, seen: map[string]bool{}}
	found := map[cache.UniqueVolumeName]bool{}

	pods := w.dirs("pods")
	for _, uid := range pods {
		for _, name := range w.dirs(path.Join("pods", uid, "volumes", "kubernetes.io~csi")) {
			out.attempted++
			rel := path.Join("pods", uid, "volumes", "kubernetes.io~csi", name)
			dir := filepath.Join(root, rel)
			w.removeWriteLeftovers(rel)
			rec := w.record(rel)
			data, err := csiplugin.ReadVolumeData(r, rel)
			var spec cache.VolumeSpec
			var vol cache.PodVolume
			switch {
			case err == nil:
				spec, vol = reconstructedSpec(data, types.UID(uid), name)
			case rec != nil && rec.PodUID == uid && rec.SpecName == name:
				// The record knows the volume as well as vol_data.json would.
				logger.Error(err, "Cannot read vol_data.json; reconstructing the pod volume from nodevol's record", "podUID", uid, "path", dir)
				spec, vol = reconstructedSpec(recordVolumeData(rec), types.UID(uid), name)
			default:
				// A directory that cannot hold data (SetUp stopped before
				// vol_data.json) would hold the device for good: it goes.
				rerr := w.removeUnused(rel, "mount")
				if rerr == nil {
					logger.Info("Removed a pod volume directory without vol_data.json that holds nothing", "podUID", uid, "path", dir, "err", err.Error())
					continue
				}
				logger.Error(err, "Cannot reconstruct pod volume, leaving it alone; the staged device of the PV it names is not unstaged while it is there", "podUID", uid, "path", dir, "notRemoved", rerr.Error())
				out.unreadable = append(out.unreadable, dir)
				continue
			}
			state, ok := w.recover(rel, "mount", rec)
			if !ok {
				continue // a reboot's leftover, removed: nothing to tear down
			}
			out.mounts = append(out.mounts, foundMount{spec: spec, vol: vol, path: filepath.Join(dir, "mount"), state: state})
			if !spec.Ephemeral && !found[spec.Name] {
				if d, ok := w.stagedDevice(spec); ok {
					out.devices = append(out.devices, d)
				}
			}
			found[spec.Name] = true
			logger.V(2).Info("Reconstructed pod volume", "podUID", uid, "volume", spec.Name, "driver", spec.Driver, "path", dir)
		}
	}

	// Raw block volumes: the pod's symlink, the publishes left without
	// one, the volume's data directory.
	linked := map[blockPublish]bool{}
	for _, uid := range pods {
		for _, name := range w.entries(path.Join("pods", uid, "volumeDevices", "kubernetes.io~csi")) {
			linked[blockPublish{specName: name, podUID: uid}] = true
			out.attempted++
			link := filepath.Join(root, "pods", uid, "volumeDevices", "kubernetes.io~csi", name)
			spec, paths, err := reconstructBlock(r, root, name, types.UID(uid))
			if err != nil {
				logger.Error(err, "Cannot reconstruct block volume, leaving it alone", "podUID", uid, "path", link)
				out.unreadable = append(out.unreadable, link)
				continue
			}
			w.logInFlight(paths.PublishPath)
			vol := cache.PodVolume{Pod: cache.PodRef{UID: types.UID(uid)}, SpecName: spec.PVName}
			out.mounts = append(out.mounts, foundMount{spec: spec, vol: vol, path: paths.PodDevicePath, state: cache.Uncertain})
			if !found[spec.Name] {
				out.devices = append(out.devices, foundDevice{spec: spec, path: paths.StagingPath, state: cache.Uncertain})
			}
			found[spec.Name] = true
			logger.V(2).Info("Reconstructed block volume", "podUID", uid, "volume", spec.Name, "driver", spec.Driver, "path", link)
		}
	}
	w.blockPublishes(&out, found, linked)
	const csiDir = "plugins/kubernetes.io/csi"
	for _, specName := range w.dirs(path.Join(csiDir, "volumeDevices")) {
		if specName == "staging" || specName == "publish" {
			continue // the directories of the staging and publish paths
		}
		dataDir := path.Join(csiDir, "volumeDevices", specName, "data")
		w.removeWriteLeftovers(dataDir)
		file := path.Join(dataDir, csiplugin.VolumeDataFile)
		if !w.exists(file) {
			w.removeBlockLeftover(specName)
			continue
		}
		spec, paths, err := reconstructBlock(r, root, specName, "")
		if err != nil {
			logger.Error(err, "Cannot reconstruct block volume, leaving it alone", "path", filepath.Join(root, file))
			continue
		}
		w.logInFlight(paths.StagingPath)
		if !found[spec.Name] {
			out.devices = append(out.devices, foundDevice{spec: spec, path: paths.StagingPath, state: cache.Uncertain})
			found[spec.Name] = true
			logger.V(2).Info("Reconstructed staged block volume", "volume", spec.Name, "driver", spec.Driver)
		}
	}

	// Staged volumes whose pods are gone (a stop between unpublish and
	// unstage) are found through their staging directories.
	for _, driver := range w.dirs(csiDir) {
		for _, name := range w.dirs(path.Join(csiDir, driver)) {
			rel := path.Join(csiDir, driver, name)
			if !w.exists(path.Join(rel, csiplugin.VolumeDataFile)) {
				w.removeStagingLeftover(driver, name)
				continue
			}
			dir := filepath.Join(root, rel)
			w.removeWriteLeftovers(rel)
			data, err := csiplugin.ReadVolumeData(r, rel)
			if err != nil {
				if rec := w.record(rel); rec != nil && rec.PodUID == "" {
					logger.Error(err, "Cannot read vol_data.json; reconstructing the staged volume from nodevol's record", "path", dir)
					data = recordVolumeData(rec)
				} else {
					logger.Error(err, "Cannot reconstruct staged volume, leaving it alone", "path", dir)
					continue
				}
			}
			spec := cache.VolumeSpec{Name: cache.CSIVolumeName(data.DriverName, data.VolumeHandle), PVName: data.SpecVolID, Driver: data.DriverName, VolumeHandle: data.VolumeHandle, Mode: cache.Filesystem}
			if found[spec.Name] {
				continue
			}
			want, err := csiplugin.StagingDir(root, spec.Driver, spec.VolumeHandle)
			if legacy, lerr := csiplugin.LegacyStagingDir(root, name); driver == "pv" && want != dir && lerr == nil && legacy == dir {
				// Staged by an older kubelet, by PV name (its vol_data.json
				// has no specVolID): stagedDevice finds it there.
				spec.PVName, want, err = name, dir, nil
			}
			// Only a directory at the path nodevol itself would use is its own.
			if err != nil || want != dir {
				logger.Error(err, "Staging directory does not match its vol_data.json, leaving it alone", "path", dir, "driver", spec.Driver)
				continue
			}
			if d, ok := w.stagedDevice(spec); ok {
				out.devices = append(out.devices, d)
				found[spec.Name] = true
				logger.V(2).Info("Reconstructed staged volume", "volume", spec.Name, "driver", spec.Driver, "path", dir)
			}
		}
	}
	w.removeOrphanRecords()
	return out
}

// walker lists the directories under the root without following a
// symlink, logging each symlink it finds where a directory is expected.
type walker struct {
	logger klog.Logger
	r      *rootfs.Root
	root   string // as given: the paths found are built on it
	rc     recovery
	// seen are the record files of the directories visited.
	seen map[string]bool
}

// entries lists the names in directory dir (relative to the root); a
// missing dir has none. A dir that is, or is below, a symlink is logged and
// has none.
func (w walker) entries(dir string) []string {
	list, err := w.r.ReadDir(dir)
	if err != nil {
		w.refused(err, dir)
		return nil
	}
	names := make([]string, 0, len(list))
	for _, e := range list {
		names = append(names, e.Name())
	}
	return names
}

// dirs lists the directories in dir, as entries does; a symlink in dir is
// logged and skipped, as is anything else that is not a directory.
func (w walker) dirs(dir string) []string {
	list, err := w.r.ReadDir(dir)
	if err != nil {
		w.refused(err, dir)
		return nil
	}
	var names []string
	for _, e := range list {
		switch {
		case e.Type()&fs.ModeSymlink != 0:
			w.logger.Info("Ignoring a symlink where a directory is expected: symlinks under the root are not followed", "path", filepath.Join(w.r.Path(), dir, e.Name()))
		case e.IsDir():
			names = append(names, e.Name())
		}
	}
	return names
}

// exists tells whether name is there (a symlink included) and reached
// without following a symlink.
func (w walker) exists(name string) bool {
	_, err := w.r.Lstat(name)
	if err != nil {
		w.refused(err, name)
	}
	return err == nil
}

// refused logs why a path could not be read, unless it is simply missing.
func (w walker) refused(err error, name string) {
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case errors.Is(err, rootfs.ErrSymlink):
		w.logger.Info("Ignoring a path through a symlink: symlinks under the root are not followed", "err", err.Error())
	default:
		w.logger.Error(err, "Cannot read a directory under the root, skipping it", "path", name)
	}
}

// reconstructBlock is what a block volume's vol_data.json tells of it.
func reconstructBlock(r *rootfs.Root, root, specName string, uid types.UID) (cache.VolumeSpec, csiplugin.BlockPaths, error) {
	paths, err := csiplugin.BlockVolumePaths(root, specName, uid)
	if err != nil {
		return cache.VolumeSpec{}, paths, err
	}
	d, err := csiplugin.ReadVolumeData(r, path.Join("plugins/kubernetes.io/csi/volumeDevices", specName, "data"))
	if err != nil {
		return cache.VolumeSpec{}, paths, err
	}
	return cache.VolumeSpec{
		Name: cache.CSIVolumeName(d.DriverName, d.VolumeHandle), PVName: specName,
		Driver: d.DriverName, VolumeHandle: d.VolumeHandle, Mode: cache.Block,
	}, paths, nil
}

// stagedDevice returns spec's device if its staging directory exists (and
// is a directory, not a symlink).
func (w walker) stagedDevice(spec cache.VolumeSpec) (foundDevice, bool) {
	stagingPath, err := csiplugin.StagingPath(w.root, spec.Driver, spec.VolumeHandle)
	if err != nil {
		return foundDevice{}, false
	}
	dir, _ := csiplugin.StagingDir(w.r.Path(), spec.Driver, spec.VolumeHandle)
	// An older kubelet's staging directory (by PV name), where the plugin
	// stages and unstages the volume too.
	switch legacy, ok, err := csiplugin.FindLegacyStaging(w.r, w.root, spec.PVName, spec.Driver, spec.VolumeHandle); {
	case err != nil:
		w.logger.Info("Ignoring the legacy staging directory of a volume", "volume", spec.Name, "err", err.Error())
	case ok:
		stagingPath = filepath.Join(legacy, "globalmount")
		dir, _ = csiplugin.LegacyStagingDir(w.r.Path(), spec.PVName)
	}
	fi, err := w.r.Lstat(dir)
	switch {
	case err != nil:
		w.refused(err, dir)
		return foundDevice{}, false
	case fi.Mode()&fs.ModeSymlink != 0:
		w.logger.Info("Ignoring a symlink where a staging directory is expected: symlinks under the root are not followed", "path", dir)
		return foundDevice{}, false
	}
	rel, err := w.r.Rel(dir)
	if err != nil {
		return foundDevice{}, false
	}
	state, ok := w.recover(rel, "globalmount", w.record(rel))
	if !ok {
		return foundDevice{}, false
	}
	d := foundDevice{spec: spec, path: stagingPath, state: state}
	if data, err := csiplugin.ReadVolumeData(w.r, rel); err == nil {
		d.seLinuxContext = data.SELinuxMountContext
	}
	return d, true
}

// removeWriteLeftovers removes the temporary files of vol_data.json
// writes a crash cut short in volume directory rel: they would make the
// kubelet's teardown fail after a hand-over (it rmdirs the directory), and
// nodevol's. Logged when it cannot.
func (w walker) removeWriteLeftovers(rel string) {
	if err := csiplugin.RemoveWriteLeftovers(w.r, rel); err != nil {
		w.logger.Error(err, "Cannot remove the leftovers of an interrupted vol_data.json write", "path", filepath.Join(w.root, rel))
	}
}

// removeUnused removes volume directory rel (with leaf "mount" or
// "globalmount") if nothing in it can hold data
// (csiplugin.RemoveUnusedVolumeDir); the error says why it did not.
func (w walker) removeUnused(rel, leaf string) error {
	if w.rc.mountPoints == nil {
		return errors.New("the mount table is unknown: nothing is removed that may be mounted")
	}
	return csiplugin.RemoveUnusedVolumeDir(w.r, func(p string) bool { return w.rc.mountPoints[p] }, rel, leaf)
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
func (w walker) removeStagingLeftover(driver, name string) {
	if !csiplugin.IsStagingDirName(driver, name) {
		return
	}
	rel := path.Join("plugins/kubernetes.io/csi", driver, name)
	dir := filepath.Join(w.root, rel)
	w.removeWriteLeftovers(rel)
	if err := w.removeUnused(rel, "globalmount"); err != nil {
		w.logger.Error(err, "Staging directory without vol_data.json, leaving it alone", "path", dir, "driver", driver)
		return
	}
	w.logger.Info("Removed a staging directory without vol_data.json that holds nothing", "path", dir, "driver", driver)
}

// removeBlockLeftover removes a raw block volume directory that has no
// vol_data.json and holds nothing (csiplugin.RemoveUnusedBlockDir): a stop
// cut its creation or its removal short. Anything else is logged and left.
func (w walker) removeBlockLeftover(specName string) {
	dir := filepath.Join(w.root, "plugins/kubernetes.io/csi/volumeDevices", specName)
	if err := csiplugin.RemoveUnusedBlockDir(w.r, specName); err != nil {
		w.logger.Error(err, "Block volume directory without vol_data.json, leaving it alone", "path", dir)
		return
	}
	w.logger.Info("Removed a block volume directory without vol_data.json that holds nothing", "path", dir)
}

// record reads the record of directory rel; nil when there is none or it
// cannot be used (logged: the volume is then recovered from vol_data.json
// and the mount table alone).
func (w walker) record(rel string) *csiplugin.Record {
	w.seen[path.Base(csiplugin.RecordFile(rel))] = true
	rec, err := csiplugin.ReadRecord(w.r, rel)
	switch {
	case err == nil:
		return rec
	case errors.Is(err, fs.ErrNotExist):
	default:
		// Anything but a regular file where the record goes is taken back,
		// so that it does not stand in the way of the next write (a
		// directory that is not empty stays, and is only logged).
		if taken, _ := csiplugin.TakeBackRecord(w.r, rel); taken {
			w.logger.Info("Removed what stood where nodevol's record of a volume directory goes, not a regular file; recovering it as Uncertain from vol_data.json",
				"path", filepath.Join(w.root, csiplugin.RecordFile(rel)), "dir", filepath.Join(w.root, rel), "err", err.Error())
			return nil
		}
		w.logger.Error(err, "Ignoring nodevol's record of a volume directory; recovering it as Uncertain from vol_data.json", "path", filepath.Join(w.root, rel))
	}
	return nil
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
func (w walker) recover(rel, leaf string, rec *csiplugin.Record) (state cache.MountState, ok bool) {
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
		err := csiplugin.RemoveUnusedVolumeDir(w.r, func(p string) bool { return w.rc.mountPoints[p] }, rel, leaf)
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
	if rec := w.record(rel); rec != nil && !rec.Phase.Done() {
		w.logger.Info("A call was in flight when nodevol stopped; it is repeated if the volume is wanted and undone if not",
			"path", abs, "call", rec.Phase.Call(), "driver", rec.Driver, "volumeHandle", rec.VolumeHandle)
	}
}

// removeOrphanRecords removes the records whose directory no longer
// exists (a stop between removing a volume's directory and its record).
// A record it cannot read, or whose directory is still there, is left.
func (w walker) removeOrphanRecords() {
	for _, shard := range w.dirs(csiplugin.RecordsDir) {
		w.removeOrphanRecordsIn(path.Join(csiplugin.RecordsDir, shard))
	}
}

func (w walker) removeOrphanRecordsIn(dir string) {
	list, err := w.r.ReadDir(dir)
	if err != nil {
		w.refused(err, dir)
		return
	}
	for _, e := range list {
		if w.seen[e.Name()] || !e.Type().IsRegular() {
			continue
		}
		name := path.Join(dir, e.Name())
		var rec csiplugin.Record
		if err := fsutil.ReadJSONIn(w.r, name, &rec); err != nil || rec.Dir == "" || csiplugin.RecordFile(rec.Dir) != name {
			w.logger.Error(err, "Leaving a record that does not name its directory", "path", filepath.Join(w.root, name))
			continue
		}
		if _, err := w.r.Lstat(rec.Dir); !errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err := w.r.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			w.logger.Error(err, "Cannot remove the record of a directory that is gone", "path", filepath.Join(w.root, name))
			continue
		}
		w.logger.V(2).Info("Removed the record of a directory that is gone", "dir", rec.Dir, "phase", rec.Phase)
	}
}

// recordVolumeData is the vol_data.json a record stands for.
func recordVolumeData(rec *csiplugin.Record) *csiplugin.VolumeData {
	d := &csiplugin.VolumeData{SpecVolID: rec.PVName, VolumeHandle: rec.VolumeHandle, DriverName: rec.Driver}
	if rec.Ephemeral {
		d.VolumeLifecycleMode = lifecycleEphemeral
	}
	return d
}

// reconstructedSpec is what vol_data.json tells of a pod's volume: enough
// to tear it down, and the same unique name the populator gives it, so a
// pod that still wants it finds it.
func reconstructedSpec(d *csiplugin.VolumeData, uid types.UID, dirName string) (cache.VolumeSpec, cache.PodVolume) {
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
