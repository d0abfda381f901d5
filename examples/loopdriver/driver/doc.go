// Package driver is a CSI driver that keeps each volume as a sparse
// image file in a state directory and attaches it on the node through a
// loop device: a real driver for nodevol's end-to-end tests, small
// enough to read, proven by kubernetes-csi's csi-sanity.
//
// One process serves the Identity, Controller and Node services for one
// node. The controller side creates, deletes, grows and lists images and
// records which node a volume is published to; the node side attaches
// an image to a loop device and makes and mounts a file system on it
// (NodeStageVolume), bind-mounts it into a pod directory or onto a block
// device file (NodePublishVolume), and undoes both.
//
// It also serves inline ephemeral volumes (a pod's csi volume source;
// the CSIDriver object lists Ephemeral in spec.volumeLifecycleModes, and
// should set podInfoOnMount so that the kubelet says
// csi.storage.k8s.io/ephemeral=true): NodePublishVolume, called without
// NodeStageVolume and with the kubelet's volume ID, makes the image (of
// the volume attribute size, a quantity such as 64Mi; 64 MiB
// without it), attaches it, makes an ext4 (or the capability's fs_type)
// and mounts it at the target; NodeUnpublishVolume unmounts, detaches and
// deletes it. A publish without a staging path and without that key is
// taken as ephemeral too (a kubelet without podInfoOnMount sends none).
//
// # Contract
//
//   - Every RPC is idempotent: repeating a successful call succeeds and
//     changes nothing. A call that fails part way undoes what it did (a
//     loop device it attached, a mount it made, a target it created).
//   - Calls on one volume run one at a time; a call that cannot get the
//     volume before its deadline fails with Aborted. Calls on different
//     volumes run in parallel.
//   - NodeUnpublishVolume of a volume the driver does not know is
//     success when nothing is at the target path (an ephemeral volume
//     deleted by an earlier call whose answer was lost), NotFound
//     otherwise.
//   - Errors use the CSI spec's codes: InvalidArgument (naming the
//     field) for missing or malformed fields, including volume IDs and
//     names that are not one safe path element; NotFound for unknown
//     volumes, nodes and paths; FailedPrecondition for calls out of
//     order (publish before stage, unstage while published, delete while
//     in use); AlreadyExists for an incompatible repeat.
//   - A file system that holds data is never formatted again: staging
//     formats only a device on which blkid finds nothing.
//   - State lives in {statedir}/volumes/{id}.json (format version 1)
//     beside the image {id}.img, written atomically, so a restarted
//     driver continues where the old one stopped; an ephemeral volume's
//     state is written before its image is made and removed after its
//     image is deleted, so a publish or unpublish that a crash cut short
//     is finished by the next call. The loop device of a
//     volume is always found by its backing image (losetup --associated),
//     never remembered, so attachments that a crash left behind are
//     reused or detached, not leaked.
//   - A detach is done when the device is gone, not when losetup
//     --detach returns: the kernel only marks a device that something
//     else has open and detaches it at the last close. NodeUnstageVolume
//     waits for that; staging and DeleteVolume wait for a device being
//     detached rather than reuse it or refuse; past Config.DetachTimeout
//     or the call's deadline they fail with Unavailable, to be retried.
//   - The driver touches no path outside its state directory and the
//     staging and target paths it is given; those must be absolute,
//     clean and outside the state directory.
//
// Faults (the --fault flag; options.Faults and options.FaultHook in its own tests) make the
// driver delay, fail or exit in the middle of an RPC, for tests of what
// a CO does when a driver misbehaves.
//
// It runs as a program, Main (the loopdriver command, or a hidden
// subcommand of another); its only API is CSI's gRPC one. Its Go types
// are unexported: its own tests start it in process (newServer, serve).
package driver
