// Package registration registers the CSI drivers announced through plugin
// registration and records them on the node as the kubelet does.
//
// Handler is the pluginmanager.Handler for the "CSIPlugin" type: it
// validates a driver's name and versions, registers it in a csi.Registry,
// asks it for its node information and records it in the Node's
// csi.volume.kubernetes.io/nodeid annotation, its topology labels and the
// CSINode object (with the migrated in-tree plugins). Run creates the
// CSINode at start and keeps the drivers' allocatable counts current.
// SetNodeAttachMode sets the Node's attach-mode annotation for an agent.
//
// volumemanager wires a Handler itself when Config.PluginRegistration is
// set; an embedder that runs its own plugin manager (the kubelet fork,
// whose plugin manager is the kubelet's) makes one with New, hands it to
// that manager for "CSIPlugin" and runs Run beside it.
package registration
