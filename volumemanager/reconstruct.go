package volumemanager

import (
	"context"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/cache"
	"github.com/nodevol/nodevol/csiplugin"
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
}

type foundMount struct {
	spec cache.VolumeSpec
	vol  cache.PodVolume
	path string
}

type foundDevice struct {
	spec cache.VolumeSpec
	path string
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
func reconstruct(ctx context.Context, root string) diskState {
	logger := klog.FromContext(ctx)
	var out diskState
	found := map[cache.UniqueVolumeName]bool{}

	podDirs, _ := filepath.Glob(filepath.Join(root, "pods", "*", "volumes", "kubernetes.io~csi", "*"))
	for _, dir := range podDirs {
		uid := types.UID(filepath.Base(filepath.Dir(filepath.Dir(filepath.Dir(dir)))))
		data, err := csiplugin.LoadVolumeData(dir)
		if err != nil {
			logger.Error(err, "Cannot reconstruct pod volume, leaving it alone; the staged device of the PV it names is not unstaged while it is there", "podUID", uid, "path", dir)
			out.unreadable = append(out.unreadable, dir)
			continue
		}
		spec, vol := reconstructedSpec(data, uid, filepath.Base(dir))
		out.mounts = append(out.mounts, foundMount{spec: spec, vol: vol, path: filepath.Join(dir, "mount")})
		if !spec.Ephemeral && !found[spec.Name] {
			if d, ok := stagedDevice(root, spec); ok {
				out.devices = append(out.devices, d)
			}
		}
		found[spec.Name] = true
		logger.V(2).Info("Reconstructed pod volume", "podUID", uid, "volume", spec.Name, "driver", spec.Driver, "path", dir)
	}

	// Raw block volumes: the pod's symlink, the volume's data directory.
	links, _ := filepath.Glob(filepath.Join(root, "pods", "*", "volumeDevices", "kubernetes.io~csi", "*"))
	for _, link := range links {
		uid := types.UID(filepath.Base(filepath.Dir(filepath.Dir(filepath.Dir(link)))))
		spec, paths, err := reconstructBlock(root, filepath.Base(link), uid)
		if err != nil {
			logger.Error(err, "Cannot reconstruct block volume, leaving it alone", "podUID", uid, "path", link)
			out.unreadable = append(out.unreadable, link)
			continue
		}
		vol := cache.PodVolume{Pod: cache.PodRef{UID: uid}, SpecName: spec.PVName}
		out.mounts = append(out.mounts, foundMount{spec: spec, vol: vol, path: paths.PodDevicePath})
		if !found[spec.Name] {
			out.devices = append(out.devices, foundDevice{spec: spec, path: paths.StagingPath})
		}
		found[spec.Name] = true
		logger.V(2).Info("Reconstructed block volume", "podUID", uid, "volume", spec.Name, "driver", spec.Driver, "path", link)
	}
	blockData, _ := filepath.Glob(filepath.Join(root, "plugins", "kubernetes.io", "csi", "volumeDevices", "*", "data", csiplugin.VolumeDataFile))
	for _, file := range blockData {
		specName := filepath.Base(filepath.Dir(filepath.Dir(file)))
		spec, paths, err := reconstructBlock(root, specName, "")
		if err != nil {
			logger.Error(err, "Cannot reconstruct block volume, leaving it alone", "path", file)
			continue
		}
		if !found[spec.Name] {
			out.devices = append(out.devices, foundDevice{spec: spec, path: paths.StagingPath})
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
		spec := cache.VolumeSpec{Name: cache.CSIVolumeName(data.DriverName, data.VolumeHandle), PVName: data.SpecVolID, Driver: data.DriverName, VolumeHandle: data.VolumeHandle, Mode: cache.Filesystem}
		if found[spec.Name] {
			continue
		}
		// Only a directory at the path nodevol itself would use is its own.
		if want, err := csiplugin.StagingDir(root, spec.Driver, spec.VolumeHandle); err != nil || want != dir {
			logger.Error(err, "Staging directory does not match its vol_data.json, leaving it alone", "path", dir, "driver", spec.Driver)
			continue
		}
		if d, ok := stagedDevice(root, spec); ok {
			out.devices = append(out.devices, d)
			found[spec.Name] = true
			logger.V(2).Info("Reconstructed staged volume", "volume", spec.Name, "driver", spec.Driver, "path", dir)
		}
	}
	return out
}

// reconstructBlock is what a block volume's vol_data.json tells of it.
func reconstructBlock(root, specName string, uid types.UID) (cache.VolumeSpec, csiplugin.BlockPaths, error) {
	paths, err := csiplugin.BlockVolumePaths(root, specName, uid)
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

// stagedDevice returns spec's device if its staging directory exists.
func stagedDevice(root string, spec cache.VolumeSpec) (foundDevice, bool) {
	path, err := csiplugin.StagingPath(root, spec.Driver, spec.VolumeHandle)
	if err != nil {
		return foundDevice{}, false
	}
	if _, err := os.Lstat(filepath.Dir(path)); err != nil {
		return foundDevice{}, false
	}
	return foundDevice{spec: spec, path: path}, true
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
