// Package csiplugin does a CSI volume's operations on the node, as the
// kubelet's kubernetes.io/csi plugin does, and implements
// volume.Plugin.
//
//   - WaitForAttach reads the CSIDriver and VolumeAttachment objects
//     from informer listers (no API GETs); Attach and Detach create and
//     delete the VolumeAttachment in self-attach mode.
//   - MountDevice / UnmountDevice call NodeStageVolume /
//     NodeUnstageVolume on the staging path.
//   - SetUp / TearDown call NodePublishVolume / NodeUnpublishVolume
//     on the pod's volume path, giving the pod's fsGroup ownership of the
//     volume (internal/fsgroup) when the driver does not.
//   - Raw block volumes are staged, published and mapped into pods;
//     NodeExpand and VolumeStats expand and measure published volumes.
//   - Reconstruct (volume.Reconstructor) finds at start what earlier
//     runs left on disk, with the root held once; what each volume found
//     there is, and the state it was left in, is decided by
//     csiplugin/internal/reconstruct from the internal/ondisk scan and
//     the records.
//
// The drivers are reached through package csi; the on-disk layout,
// vol_data.json and the records of work in flight are internal/ondisk's.
// Drivers are registered by package registration.
//
// Errors name the pod, volume and driver involved and wrap their cause with
// %w. Errors wrapping volume.ErrNotReady mean nothing was changed
// and the operation waits for something (a driver registration, an
// attachment); errors wrapping volume.ErrInProgress mean the
// volume may be half set up and must be treated as uncertain; any other
// error is final for the current state of the world, and what the failed
// operation created on disk has been removed again.
package csiplugin
