// Package podvol holds a pod's volumes as plain data that the plugin contract
// and the volume manager's API share (no API objects, no plugin
// objects): a volume's UniqueVolumeName and VolumeSpec, a pod's PodRef and
// PodVolume, and the MountedVolume that GetMountedVolumesForPod reports.
//
// A volume is named by its UniqueVolumeName, the kubelet's
// "kubernetes.io/csi/{driver}^{handle}", so that the Node's
// status.volumesInUse means the same to both. The desired and actual states
// built from these types are the volume manager's own
// (volumemanager/internal/state).
package podvol
