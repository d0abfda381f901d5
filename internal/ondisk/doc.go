// Package ondisk owns the kubelet's on-disk layout of CSI volumes as
// nodevol writes and reads it: the paths, vol_data.json, nodevol's records
// of work in flight, the legacy staging path, the leftovers a stop leaves,
// and the scan that reconstruction reads.
//
// The layout is the kubelet's (see StagingPath, PodVolumePath,
// BlockVolumePaths and VolumeData), so that the kubelet and nodevol can
// each clean up after the other. Every name that comes from outside
// (driver name, pod UID, PV or spec name) is checked with
// fsutil.ValidateName before it becomes a path element; a volume handle
// only appears in paths hashed. The writers of vol_data.json
// (WriteVolumeData) and of the records (Records) live here with their
// readers, so that one package owns the format; users of nodevol never
// import it.
package ondisk
