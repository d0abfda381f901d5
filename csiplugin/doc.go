// Package csiplugin is nodevol's CSI volume plugin: it does on the node what
// the kubelet's kubernetes.io/csi plugin does, and implements
// volume.Plugin.
//
//   - Registry keeps the registered CSI drivers: one gRPC connection per
//     driver endpoint, kept open and shared by every operation, and the
//     driver's node capabilities, fetched once per registration.
//   - Client calls a driver's Node service with a per-call timeout and
//     classifies gRPC errors once: errors that mean "the operation may have
//     started and may still finish" wrap volume.ErrInProgress.
//   - Plugin.WaitForAttach reads the CSIDriver and VolumeAttachment objects
//     from informer listers (no API GETs).
//   - Plugin.MountDevice / UnmountDevice call NodeStageVolume /
//     NodeUnstageVolume on the staging path.
//   - Plugin.SetUp / TearDown call NodePublishVolume / NodeUnpublishVolume
//     on the pod's volume path.
//
// On-disk layout and metadata files are the kubelet's (see StagingPath,
// PodVolumePath and VolumeData), so that the kubelet and nodevol can each
// clean up after the other. Every name that comes from outside (driver name,
// pod UID, PV or spec name) is checked with fsutil.ValidateName before it
// becomes a path element; a volume handle only appears in paths hashed.
//
// Errors name the pod, volume and driver involved and wrap their cause with
// %w. Errors wrapping volume.ErrNotReady mean nothing was changed
// and the operation waits for something (a driver registration, an
// attachment); errors wrapping volume.ErrInProgress mean the
// volume may be half set up and must be treated as uncertain; any other
// error is final for the current state of the world, and what the failed
// operation created on disk has been removed again.
package csiplugin
