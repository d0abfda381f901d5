// Package csi talks to CSI drivers' Node services: a registry of the
// registered drivers with one kept gRPC connection each, and a client
// whose calls are bounded and whose errors are classified once.
//
//   - Registry keeps the registered CSI drivers: one gRPC connection per
//     driver endpoint, kept open and shared by every operation, and the
//     driver's node capabilities, fetched once per registration; calls are
//     measured as the kubelet's csi_operations_seconds.
//   - Client calls a driver's Node service with a per-call timeout and
//     classifies gRPC errors once (CallError): errors that mean "the
//     operation may have started and may still finish" wrap
//     volume.ErrInProgress.
//   - Capabilities are a driver's node capabilities as data, with the
//     access mode a PV's mode maps to; NodeGetVolumeStats reads the volume
//     condition of CSI 1.3 to 1.12 from the wire.
//
// The CSI spec's own package is imported as csipb beside this one.
package csi
