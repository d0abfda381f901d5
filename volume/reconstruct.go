package volume

import (
	"context"

	"github.com/nodevol/nodevol/podvol"
)

// Reconstructor is implemented by a plugin that leaves on disk what it
// sets up, so that a restart finds it: at start the volume manager asks
// each plugin what earlier runs left, before any pod is planned, and
// installs it as its first actual state. A plugin that leaves nothing (the
// image plugin) does not implement it.
type Reconstructor interface {
	// Reconstruct returns what earlier runs of the plugin left on the
	// node: pod mounts and staged devices, each Uncertain unless the
	// plugin's own records and rc show it Mounted, and the pod volume
	// directories it could not read. It removes only what can hold no
	// data and nothing else would ever remove (the leftovers of a reboot,
	// directories a stop left empty).
	Reconstruct(ctx context.Context, rc Recovery) Found
	// Retake removes dir, a pod volume directory Reconstruct found
	// unreadable, once nothing in it can hold data; mounted are the
	// node's mount points, read afresh. It reports whether dir is gone.
	Retake(ctx context.Context, dir string, mounted map[string]bool) bool
}

// Recovery is what a Reconstructor compares its records of work in flight
// with.
type Recovery struct {
	// BootID is this boot's ID; "" when unknown: no record is then taken
	// for one of another boot.
	BootID string
	// MountPoints are the node's mount points (from the mount table); nil
	// when they could not be listed: no volume is then trusted as
	// Mounted, and no reboot leftover is removed.
	MountPoints map[string]bool
}

// Found is what a Reconstructor found on disk: plain data.
type Found struct {
	// Mounts are pod mounts, Devices staged devices.
	Mounts  []FoundMount
	Devices []FoundDevice
	// Unreadable are the pod volume directories (and block symlinks)
	// that could not be read: each may hold the mount of the PV it is
	// named after.
	Unreadable []string
	// Attempted counts the pod volumes found: those reconstructed, those
	// unreadable and the leftovers of a reboot.
	Attempted int
}

// FoundMount is a pod mount found on disk.
type FoundMount struct {
	Spec   podvol.VolumeSpec
	Volume podvol.PodVolume
	Path   string
	State  podvol.MountState // Mounted or Uncertain
}

// FoundDevice is a staged device found on disk.
type FoundDevice struct {
	Spec  podvol.VolumeSpec
	Path  string
	State podvol.MountState // Mounted or Uncertain
	// SELinuxContext is the SELinux context the device was staged with.
	SELinuxContext string
}
