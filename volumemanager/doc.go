// Package volumemanager is nodevol's public facade: a VolumeManager does on
// a node what the kubelet's volume manager does, for the volumes its
// plugins handle (package volume: CSI, image volumes, and an embedder's own
// through Config.Plugins). For every pod added to it, it finds each pod
// volume's plugin, resolves the volume (for CSI: PVC to PV, generic
// ephemeral, inline, in-tree through CSI migration), waits for its
// attachment, stages it (NodeStageVolume), publishes it into the pod's
// directory (NodePublishVolume), and tears it all down in the right order
// when the pod is deleted.
//
// Create one with New (Config's fields state their defaults), start it with
// Run, register CSI drivers through Drivers (or Config.PluginRegistration),
// then feed it pods: AddPod, UpdatePod, DeletePod and, once every pod
// running on the node has been added, MarkPodsSynced. WaitForAttachAndMount
// and WaitForUnmount block until a pod's volumes are mounted or gone; their
// *WaitError names each volume not ready and why. WaitForUnmount returns
// once the pod's volumes are unpublished, before NodeUnstageVolume, as the
// kubelet's does; WaitForUnstaged waits for the whole node to be torn down
// to the end (nothing wanted, published, staged, attached by the node or
// running), for an agent about to exit after its pods went or a test that
// checks the node is clean, and its *UnstageWaitError names each volume
// left and why (its unstage's last error, the call still running).
//
// The API objects the pods read come through one node-scoped object cache
// (internal/objectcache), one entry per object held by the pods that use
// it and dropped with the last: their claims and the volumes those are
// bound to, the VolumeAttachments their volumes wait for, the configMaps,
// secrets and ClusterTrustBundles of their volumes, and the configMaps and
// secrets their containers' env reads. A node's memory and API load then
// follow its own pods, not the cluster, and a node's own credentials (the
// Node authorizer) suffice. Config.ClusterInformers asks for informers on
// every claim, volume and attachment of the cluster instead. Objects reads
// the pods' configMaps and secrets, for an agent that resolves its
// containers' environment.
//
// One goroutine, the reconcile loop, owns the actual state: it takes the
// changes posted by AddPod, the informers and driver registration, plans
// each changed volume with a pure function (internal/planner; the scenario scripts
// in testdata/ show its decisions) and runs the operations it decides with
// bounded concurrency and per-volume backoff. Failed operations are logged
// once with their next retry time and, with Config.EventRecorder, recorded
// as events on the pod. After a restart, Run first reads what an earlier
// run (or the kubelet) left on disk; nothing found there is torn down
// before MarkPodsSynced, nor while a pod waits for the API server to answer
// for its claims and volumes.
package volumemanager
