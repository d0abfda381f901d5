// Package cache holds nodevol's two views of a node's CSI volumes, as plain
// data (no API objects, no plugin objects):
//
//   - DesiredStateOfWorld: the pods on the node and, resolved once from
//     their claims, volumes and inline sources, the VolumeSpec of each CSI
//     volume they want mounted. The volume manager's populator writes it.
//   - ActualStateOfWorld: what is really attached, staged and published,
//     with a MountState (NotMounted, Uncertain, Mounted) for each device
//     and each pod's mount. The reconcile loop is its only writer.
//
// Both are safe for concurrent use; readers get copies. A volume is named
// by its UniqueVolumeName, the kubelet's "kubernetes.io/csi/{driver}^{handle}",
// so that the Node's status.volumesInUse means the same to both.
package cache
