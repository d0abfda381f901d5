package ondisk

import (
	"path/filepath"

	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/internal/fsutil"
)

// Raw block volumes, with the kubelet's layout (csi_block.go):
//
//	{root}/plugins/kubernetes.io/csi/volumeDevices/staging/{specName}          staging path (NodeStage)
//	{root}/plugins/kubernetes.io/csi/volumeDevices/publish/{specName}/{podUID} publish path (NodePublish)
//	{root}/plugins/kubernetes.io/csi/volumeDevices/{specName}/dev/{podUID}     map file: bind mount of the
//	                                                                           publish path, held by a loop device
//	{root}/plugins/kubernetes.io/csi/volumeDevices/{specName}/data/vol_data.json
//	{root}/pods/{podUID}/volumeDevices/kubernetes.io~csi/{specName}            symlink to the publish path

const (
	volumeDevicesDir    = "volumeDevices"
	podVolumeDevicesDir = "volumeDevices/kubernetes.io~csi"
)

// BlockPaths are a block volume's paths for one pod (PodUID may be empty
// for the volume-wide ones).
type BlockPaths struct {
	// Dir holds dev/ (GlobalMapPath) and data/ (vol_data.json).
	Dir, GlobalMapPath, DataDir string
	StagingPath                 string
	// PublishDir holds one publish path per pod.
	PublishDir, PublishPath string
	// PodDeviceDir/SpecName is the symlink the pod sees.
	PodDeviceDir, PodDevicePath string
}

// BlockVolumePaths returns the paths of block volume specName (the PV's
// name) for pod podUID (may be empty). Both must be safe path elements.
func BlockVolumePaths(root, specName string, podUID types.UID) (BlockPaths, error) {
	if err := fsutil.ValidateName("spec name", specName); err != nil {
		return BlockPaths{}, err
	}
	base := filepath.Join(root, pluginDir, volumeDevicesDir)
	p := BlockPaths{
		Dir:         filepath.Join(base, specName),
		StagingPath: filepath.Join(base, "staging", specName),
		PublishDir:  filepath.Join(base, "publish", specName),
	}
	p.GlobalMapPath = filepath.Join(p.Dir, "dev")
	p.DataDir = filepath.Join(p.Dir, "data")
	if podUID != "" {
		if err := fsutil.ValidateName("pod UID", string(podUID)); err != nil {
			return BlockPaths{}, err
		}
		p.PublishPath = filepath.Join(p.PublishDir, string(podUID))
		p.PodDeviceDir = filepath.Join(root, "pods", string(podUID), podVolumeDevicesDir)
		p.PodDevicePath = filepath.Join(p.PodDeviceDir, specName)
	}
	return p, nil
}
