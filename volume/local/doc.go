// Package local is the volume plugin of local PersistentVolumes (PVs with
// spec.local), the kubelet's kubernetes.io/local-volume, with its layout on
// disk so that a node can move between the kubelet and nodevol.
//
// A local PV's path is a directory or a block device on the node:
//
//   - a directory is bind-mounted into each pod at
//     {root}/pods/{uid}/volumes/kubernetes.io~local-volume/{pv}; nothing is
//     staged;
//   - a block device used as a filesystem is formatted if it has no
//     filesystem yet (spec.local.fsType, default ext4) and mounted once per
//     node at {root}/plugins/kubernetes.io/local-volume/mounts/{pv}
//     (MountDevice), then bind-mounted into each pod from there;
//   - a block device of a PV with volumeMode Block is mapped into each pod
//     as the kubelet's generic block path does it: bind-mounted to the map
//     file {root}/plugins/kubernetes.io~local-volume/volumeDevices/{pv}/{uid},
//     held open by a loop device attached to that file, and symlinked at
//     {root}/pods/{uid}/volumeDevices/kubernetes.io~local-volume/{pv}.
//
// As the kubelet, SetUp mounts read-only when the pod's claim (or the
// spec) says so, passes the PV's mountOptions, gives the pod's fsGroup
// ownership of the files only when no other pod has the volume mounted
// (and warns, with an event, when another pod mounted it with another
// group), and TearDown unmounts and removes the pod's directory, never its
// contents. UnmountDevice refuses while a pod mount references the device
// (volume.InUseError). Reconstruct finds what the kubelet or an earlier run
// left. The PV's node affinity is the volume manager's check.
//
// What it does not do of the kubelet's: node expansion of a
// block-device-backed filesystem (NodeExpand: resize2fs/xfs_growfs after
// the PV grew), the block volume metrics beyond capacity, and the check
// that a block device is not opened elsewhere before its last unmap
// (the kubelet's DeviceOpened, which only makes it retry).
package local
