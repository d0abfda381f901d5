package volumemanager

import (
	"context"
	"os"
	"path/filepath"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/cache"
	"github.com/nodevol/nodevol/csiplugin"
)

// lifecycleEphemeral is vol_data.json's volumeLifecycleMode of an inline volume.
const lifecycleEphemeral = "Ephemeral"

// reconstructed remembers the volumes found on disk at start, whose
// teardown waits until every pod has been added once (MarkPodsSynced): a
// volume found on disk may belong to a running pod the node agent has not
// added yet, and unmounting it would pull it from under the pod
// (kubernetes#120150; the kubelet's readyToUnmount).
type reconstructed struct {
	mu     sync.Mutex
	synced bool
	names  map[cache.UniqueVolumeName]bool
}

// hold reports whether the teardown of volume name must wait.
func (r *reconstructed) hold(name cache.UniqueVolumeName) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.synced && r.names[name]
}

// release ends the wait and returns the volumes that were held.
func (r *reconstructed) release() []cache.UniqueVolumeName {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.synced {
		return nil
	}
	r.synced = true
	out := make([]cache.UniqueVolumeName, 0, len(r.names))
	for n := range r.names {
		out = append(out, n)
	}
	return out
}

// reconstruct adds the CSI volumes a previous run left on disk to the actual
// state, as the kubelet's reconstruction does, so that they are torn down
// when no pod wants them and re-published (idempotently) when one does:
// each pod volume directory with a vol_data.json becomes an Uncertain pod
// mount, each staging directory with a vol_data.json an Uncertain device;
// raw block volumes likewise, from their pod symlinks and data directories.
// Nothing is trusted as Mounted and nothing is removed here. A directory
// whose vol_data.json is missing or corrupt is logged and left alone:
// without it nodevol cannot tell which driver and volume it belongs to.
func (vm *VolumeManager) reconstruct(ctx context.Context) []cache.UniqueVolumeName {
	logger := klog.FromContext(ctx)
	root := vm.cfg.RootDir
	found := map[cache.UniqueVolumeName]bool{}

	podDirs, _ := filepath.Glob(filepath.Join(root, "pods", "*", "volumes", "kubernetes.io~csi", "*"))
	for _, dir := range podDirs {
		uid := types.UID(filepath.Base(filepath.Dir(filepath.Dir(filepath.Dir(dir)))))
		data, err := csiplugin.LoadVolumeData(dir)
		if err != nil {
			logger.Error(err, "Cannot reconstruct pod volume, leaving it alone", "podUID", uid, "path", dir)
			continue
		}
		spec, vol := reconstructedSpec(data, uid, filepath.Base(dir))
		vm.asw.SetPodMount(spec, vol, cache.Uncertain, filepath.Join(dir, "mount"))
		found[spec.Name] = true
		if !spec.Ephemeral {
			vm.reconstructDevice(spec)
		}
		logger.V(2).Info("Reconstructed pod volume", "podUID", uid, "volume", spec.Name, "driver", spec.Driver, "path", dir)
	}

	// Raw block volumes: the pod's symlink, the volume's data directory.
	links, _ := filepath.Glob(filepath.Join(root, "pods", "*", "volumeDevices", "kubernetes.io~csi", "*"))
	for _, link := range links {
		uid := types.UID(filepath.Base(filepath.Dir(filepath.Dir(filepath.Dir(link)))))
		spec, paths, err := vm.reconstructBlock(filepath.Base(link), uid)
		if err != nil {
			logger.Error(err, "Cannot reconstruct block volume, leaving it alone", "podUID", uid, "path", link)
			continue
		}
		vol := cache.PodVolume{Pod: cache.PodRef{UID: uid}, SpecName: spec.PVName}
		vm.asw.SetPodMount(spec, vol, cache.Uncertain, paths.PodDevicePath)
		vm.asw.SetDeviceState(spec, cache.Uncertain, paths.StagingPath)
		found[spec.Name] = true
		logger.V(2).Info("Reconstructed block volume", "podUID", uid, "volume", spec.Name, "driver", spec.Driver, "path", link)
	}
	blockData, _ := filepath.Glob(filepath.Join(root, "plugins", "kubernetes.io", "csi", "volumeDevices", "*", "data", csiplugin.VolumeDataFile))
	for _, file := range blockData {
		specName := filepath.Base(filepath.Dir(filepath.Dir(file)))
		spec, paths, err := vm.reconstructBlock(specName, "")
		if err != nil {
			logger.Error(err, "Cannot reconstruct block volume, leaving it alone", "path", file)
			continue
		}
		if !found[spec.Name] {
			vm.asw.SetDeviceState(spec, cache.Uncertain, paths.StagingPath)
			found[spec.Name] = true
			logger.V(2).Info("Reconstructed staged block volume", "volume", spec.Name, "driver", spec.Driver)
		}
	}

	// Staged volumes whose pods are gone (a stop between unpublish and
	// unstage) are found through their staging directories.
	stageDirs, _ := filepath.Glob(filepath.Join(root, "plugins", "kubernetes.io", "csi", "*", "*", csiplugin.VolumeDataFile))
	for _, file := range stageDirs {
		dir := filepath.Dir(file)
		data, err := csiplugin.LoadVolumeData(dir)
		if err != nil {
			logger.Error(err, "Cannot reconstruct staged volume, leaving it alone", "path", dir)
			continue
		}
		spec := cache.VolumeSpec{Name: cache.CSIVolumeName(data.DriverName, data.VolumeHandle), Driver: data.DriverName, VolumeHandle: data.VolumeHandle, Mode: cache.Filesystem}
		if found[spec.Name] {
			continue
		}
		// Only a directory at the path nodevol itself would use is its own.
		if want, err := csiplugin.StagingDir(root, spec.Driver, spec.VolumeHandle); err != nil || want != dir {
			logger.Error(err, "Staging directory does not match its vol_data.json, leaving it alone", "path", dir, "driver", spec.Driver)
			continue
		}
		if vm.reconstructDevice(spec) {
			found[spec.Name] = true
			logger.V(2).Info("Reconstructed staged volume", "volume", spec.Name, "driver", spec.Driver, "path", dir)
		}
	}

	vm.held.mu.Lock()
	vm.held.names = found
	vm.held.mu.Unlock()
	names := make([]cache.UniqueVolumeName, 0, len(found))
	for n := range found {
		names = append(names, n)
	}
	return names
}

// reconstructBlock is what a block volume's vol_data.json tells of it.
func (vm *VolumeManager) reconstructBlock(specName string, uid types.UID) (cache.VolumeSpec, csiplugin.BlockPaths, error) {
	paths, err := csiplugin.BlockVolumePaths(vm.cfg.RootDir, specName, uid)
	if err != nil {
		return cache.VolumeSpec{}, paths, err
	}
	d, err := csiplugin.LoadVolumeData(paths.DataDir)
	if err != nil {
		return cache.VolumeSpec{}, paths, err
	}
	return cache.VolumeSpec{
		Name: cache.CSIVolumeName(d.DriverName, d.VolumeHandle), PVName: specName,
		Driver: d.DriverName, VolumeHandle: d.VolumeHandle, Mode: cache.Block,
	}, paths, nil
}

// reconstructDevice marks spec's device Uncertain if its staging directory
// exists, and reports whether it did.
func (vm *VolumeManager) reconstructDevice(spec cache.VolumeSpec) bool {
	path, err := csiplugin.StagingPath(vm.cfg.RootDir, spec.Driver, spec.VolumeHandle)
	if err != nil {
		return false
	}
	if _, err := os.Lstat(filepath.Dir(path)); err != nil {
		return false
	}
	vm.asw.SetDeviceState(spec, cache.Uncertain, path)
	return true
}

// reconstructedSpec is what vol_data.json tells of a pod's volume: enough
// to tear it down, and the same unique name the populator gives it, so a
// pod that still wants it finds it.
func reconstructedSpec(d *csiplugin.VolumeData, uid types.UID, dirName string) (cache.VolumeSpec, cache.PodVolume) {
	spec := cache.VolumeSpec{Driver: d.DriverName, VolumeHandle: d.VolumeHandle, Mode: cache.Filesystem}
	vol := cache.PodVolume{Pod: cache.PodRef{UID: uid}, SpecName: dirName}
	if d.VolumeLifecycleMode == lifecycleEphemeral {
		spec.Ephemeral = true
		spec.Name = inlineVolumeName(uid, dirName)
	} else {
		spec.Name = cache.CSIVolumeName(d.DriverName, d.VolumeHandle)
		spec.PVName = dirName // the kubelet names a PV's pod directory after the PV
	}
	return spec, vol
}

// MarkPodsSynced tells the manager that every pod running on the node has
// been added (AddPod) since Run started. Until then, volumes found on disk
// at start (left by an earlier run) are not torn down even if no pod wants
// them, because their pods may simply not have been added yet. A node agent
// calls it once its pod source has delivered its initial list (for an
// informer: when the event handler's registration HasSynced).
func (vm *VolumeManager) MarkPodsSynced() {
	vm.rec.retry(vm.held.release()...)
}

// reconstructedOf returns the volumes of driver found on disk at start that
// are still held or still set up: a driver's (re-)registration may let
// their teardown proceed.
func (vm *VolumeManager) reconstructedOf(driver string) []cache.UniqueVolumeName {
	vm.held.mu.Lock()
	defer vm.held.mu.Unlock()
	var out []cache.UniqueVolumeName
	for n := range vm.held.names {
		if v, ok := vm.asw.Volume(n); ok && v.Spec.Driver == driver {
			out = append(out, n)
		}
	}
	return out
}
