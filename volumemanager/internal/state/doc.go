// Package state holds the volume manager's two views of a node's volumes, as
// plain data built from package podvol's types:
//
//   - DesiredStateOfWorld: the pods on the node and, resolved once from
//     their claims, volumes and inline sources, the VolumeSpec of each
//     volume they want mounted. The volume manager's populator writes it.
//   - ActualStateOfWorld: what is really attached, staged and published,
//     with a MountState (NotMounted, Uncertain, Mounted) for each device
//     and each pod's mount. The reconcile loop is its only writer.
//
// Both are safe for concurrent use; readers get copies. Only the volume
// manager and its planner use them, hence internal.
package state
