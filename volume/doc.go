// Package volume is the contract between nodevol's volume manager and a
// volume plugin: the interfaces it calls, the plugin's capabilities as
// data, the error classes and the registry from a pod volume's source to
// its plugin.
//
// A plugin is a Plugin (a name, the sources it handles, its capabilities
// and SetUp/TearDown, which every kind of volume has) and implements the
// other interfaces for what its volumes need: Attacher (and SelfAttacher)
// for volumes attached to the node, DeviceMounter for volumes staged once
// per node, Expander for node expansion, StatsProvider for usage,
// ObjectReader for volumes that read API objects, AttachmentNamer for
// volumes attached through a VolumeAttachment, and CallNamer when its
// calls have names of their own for messages. What a plugin does with a
// volume is data (Capabilities) the planner reads, never a decision hidden
// inside an operation; what its errors mean is one of the error classes
// (ErrInProgress, ErrNotReady, ErrInfeasible, ...), which the manager
// reads with errors.Is, never a plugin's own codes.
//
// Raw block volumes use the same calls: a plugin whose Capabilities say
// Block maps the device in MountDevice and SetUp, and unmaps it in
// TearDown and UnmountDevice, when the spec's Mode is cache.Block.
//
// A volume's unique name (podvol.UniqueVolumeName) starts with its plugin's
// name and a slash, as the kubelet's do ("kubernetes.io/csi/drv^handle"):
// the executor finds the plugin of an operation from it (Registry.ForVolume).
package volume
