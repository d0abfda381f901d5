// Package csitest is nodevol's test kit: an in-process CSI driver, builders
// for the Kubernetes objects nodevol reads, and a fake external-attacher,
// for nodevol's own tests and for those of its users.
//
//   - Server (Start, New) serves the CSI Identity and Node services (and a
//     Controller service without capabilities) on a real unix socket. It
//     keeps the node's volume state in memory and checks requests like a
//     strict driver: required fields, stage before publish, unpublish
//     before unstage, idempotent repeats. It records requests, counts
//     calls and connections, and fails, delays or holds calls on demand
//     (Inject), which is how tests reach nodevol's error, timeout and
//     uncertain-state paths. It needs no testing.TB, so demos can use it.
//   - PV, PVC, BoundClaim, EphemeralClaim, Pod, CSIDriver, Secret and
//     VolumeAttachment build typed objects with the API server's defaults
//     and deterministic UIDs, ready for a fake clientset. Each knob is a
//     field of a plain spec struct (PVSpec, CSIDriverSpec, PodSpec with its
//     PodVolumes) whose zero value is the default. CreateBound creates a
//     bound claim and its volume through any client, a real API server's
//     too, which gives the claim its own UID.
//   - RunFakeAttacher (NewFakeAttacher in tests) stands in for the
//     external-attacher, marking VolumeAttachments attached or failed;
//     AttachVolume stands in for the attach-detach controller that
//     creates them, or the attacher itself does with AttacherOptions.Node
//     (and deletes each with its PV).
//
// The package does not import csiplugin, so csiplugin's own tests can use
// it. volumemanager/vmtest puts these pieces together around a running
// VolumeManager (NewEnv) and fakes the manager itself (Fake).
package csitest
