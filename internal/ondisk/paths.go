package ondisk

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/internal/fsutil"
	"github.com/nodevol/nodevol/internal/rootfs"
	"github.com/nodevol/nodevol/podvol"
)

// On-disk names, the kubelet's.
const (
	// VolumeDataFile is the metadata file beside a staging or pod volume path.
	VolumeDataFile = "vol_data.json"
	// pluginDir is the CSI plugin's directory under the root.
	pluginDir = "plugins/kubernetes.io/csi"
	// podVolumesDir is the CSI plugin's directory in a pod's volumes directory.
	podVolumesDir = "volumes/kubernetes.io~csi"
	// StagingLeaf and PublishLeaf are the last path elements of the
	// staging and publish paths: what a driver mounts on, in a staging or
	// pod volume directory.
	StagingLeaf = "globalmount"
	PublishLeaf = "mount"
)

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// StagingDir returns the directory holding a staged volume's globalmount
// and vol_data.json: {root}/plugins/kubernetes.io/csi/{driver}/{sha256(volumeHandle)}.
// The driver name must be a safe path element.
func StagingDir(root, driver, volumeHandle string) (string, error) {
	if err := fsutil.ValidateName("driver name", driver); err != nil {
		return "", err
	}
	return filepath.Join(root, pluginDir, driver, sha256Hex(volumeHandle)), nil
}

// StagingPath returns a volume's staging path (NodeStageVolume's
// staging_target_path): StagingDir(...)/globalmount.
func StagingPath(root, driver, volumeHandle string) (string, error) {
	dir, err := StagingDir(root, driver, volumeHandle)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, StagingLeaf), nil
}

// legacyStagingPath returns the staging path older kubelets used,
// {root}/plugins/kubernetes.io/csi/pv/{pvName}/globalmount. nodevol never
// writes it; reconstruction may find volumes staged there.
func legacyStagingPath(root, pvName string) (string, error) {
	if err := fsutil.ValidateName("PV name", pvName); err != nil {
		return "", err
	}
	return filepath.Join(root, pluginDir, "pv", pvName, StagingLeaf), nil
}

// PodVolumeDir returns the directory holding a pod's volume (the "mount"
// path and vol_data.json): {root}/pods/{podUID}/volumes/kubernetes.io~csi/{specName}.
// As in the kubelet, specName is the PV's name for a volume from a PV and
// the pod's volume name for an inline volume (see VolumeDirName).
func PodVolumeDir(root string, podUID types.UID, specName string) (string, error) {
	if err := fsutil.ValidateName("pod UID", string(podUID)); err != nil {
		return "", err
	}
	if err := fsutil.ValidateName("spec name", specName); err != nil {
		return "", err
	}
	return filepath.Join(root, "pods", string(podUID), podVolumesDir, specName), nil
}

// PodVolumePath returns the path a volume is published at for a pod
// (NodePublishVolume's target_path): PodVolumeDir(...)/mount.
func PodVolumePath(root string, podUID types.UID, specName string) (string, error) {
	dir, err := PodVolumeDir(root, podUID, specName)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, PublishLeaf), nil
}

// VolumeDirName returns the name of a pod's volume directory, the
// kubelet's spec name: the name of the PV through which the pod has the
// volume (PodVolume.PVName; one volume may have several PVs, each pod's
// directory named after its own, else the spec's), the pod's volume name
// (PodVolume.SpecName) for an inline volume.
func VolumeDirName(spec *podvol.VolumeSpec, vol podvol.PodVolume) string {
	if vol.PVName != "" {
		return vol.PVName
	}
	if spec.PVName != "" {
		return spec.PVName
	}
	return vol.SpecName
}

// VolumeData is the content of vol_data.json, in the kubelet's format (a
// JSON object of strings). Beside a staging path it holds VolumeHandle and
// DriverName; beside a pod's volume path all fields are set. Both hold
// SELinuxMountContext when the volume is mounted with an SELinux context
// (the kubelet's key "seLinuxMountContext").
type VolumeData struct {
	// SpecVolID is the PV's name, or the pod's volume name for an inline
	// volume: the name of the pod's volume directory.
	SpecVolID           string `json:"specVolID,omitempty"`
	VolumeHandle        string `json:"volumeHandle"`
	DriverName          string `json:"driverName"`
	NodeName            string `json:"nodeName,omitempty"`
	AttachmentID        string `json:"attachmentID,omitempty"`
	VolumeLifecycleMode string `json:"volumeLifecycleMode,omitempty"`
	SELinuxMountContext string `json:"seLinuxMountContext,omitempty"`
}

// LoadVolumeData reads the vol_data.json in dir. It fails when the file
// is missing (errors.Is(err, fs.ErrNotExist)), corrupt (fsutil.ErrCorrupt)
// or lacks the volume handle or driver name, which a reader cannot do
// without. It follows symlinks, as os.Open does: nodevol itself reads the
// files under its root with readVolumeData.
func LoadVolumeData(dir string) (*VolumeData, error) {
	path := filepath.Join(dir, VolumeDataFile)
	var d VolumeData
	return checkVolumeData(path, &d, fsutil.ReadJSON(path, &d))
}

// readVolumeData is LoadVolumeData confined to root r: dir is relative to
// r or absolute under it, and no symlink below r is followed, the file's
// own name included (an error wrapping rootfs.ErrSymlink).
func readVolumeData(r *rootfs.Root, dir string) (*VolumeData, error) {
	path := filepath.Join(dir, VolumeDataFile)
	var d VolumeData
	return checkVolumeData(path, &d, fsutil.ReadJSONIn(r, path, &d))
}

func checkVolumeData(path string, d *VolumeData, err error) (*VolumeData, error) {
	if err != nil {
		return nil, err
	}
	if d.VolumeHandle == "" || d.DriverName == "" {
		return nil, fmt.Errorf("reading %s: %w: volumeHandle or driverName missing", path, fsutil.ErrCorrupt)
	}
	return d, nil
}

// WriteVolumeDataIn writes vol_data.json in directory d (held:
// rootfs.Root.MkdirAllSub). When made says d was just made, and so holds
// none, it is created with O_EXCL and written once on the descriptor that
// created it, not through a temporary file renamed over it: no reader
// knows the directory yet, and a stop before the write ends leaves a
// directory holding nothing but an unreadable vol_data.json, which
// RemoveUnusedVolumeDir takes as it took one holding nothing. The bytes
// and the mode are WriteVolumeData's.
func WriteVolumeDataIn(d *rootfs.Root, made bool, v *VolumeData) error {
	if made {
		data, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("encoding %s: %w", VolumeDataFile, err)
		}
		err = d.WriteFileNew(VolumeDataFile, data, 0o640, -1, -1)
		if !errors.Is(err, fs.ErrExist) {
			return err
		}
		// Someone made one meanwhile: replaced as WriteVolumeData does.
	}
	return fsutil.WriteJSONAtomicIn(d, VolumeDataFile, v, 0o640)
}

// WriteVolumeData writes dir/vol_data.json (dir relative to r or absolute
// under it) through a temporary file renamed over it, following no
// symlink under the root.
func WriteVolumeData(r *rootfs.Root, dir string, d *VolumeData) error {
	return fsutil.WriteJSONAtomicIn(r, filepath.Join(dir, VolumeDataFile), d, 0o640)
}
