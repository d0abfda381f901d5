// Package atomicwriter writes the content of a configMap, secret,
// downwardAPI or projected volume into the volume's directory with the
// kubelet's layout and semantics (its pkg/volume/util AtomicWriter), so that
// a container reading the files never sees a mix of two versions, and a
// node can move between the kubelet and nodevol with either one taking
// over the other's volumes.
//
// The layout, in the volume's directory:
//
//	..2026_01_02_15_04_05.123456789/   the files of one version, with their modes
//	..data -> ..2026_01_02_15_04_05.123456789
//	key    -> ..data/key               one link per top-level name of the payload
//	dir    -> ..data/dir               (a nested path "dir/sub/f" is reached through it)
//
// A Write puts the new version in full into a new timestamped directory,
// points ..data_tmp at it and renames ..data_tmp over ..data: that rename
// is the switch, atomic for every reader that resolves a path afresh. The
// links of new top-level names are made after the switch, those of names
// no longer in the payload removed, and older versions' directories
// removed last. A payload equal to what is there (content, modes and
// owners) changes nothing.
//
// Every path below nodevol's root is reached through internal/rootfs,
// without following a symlink: ..data and the user-visible links are the
// writer's own, read with Readlink and never followed. Every change is
// announced to the step hook (package step) first, so that the crash-point
// suite can stop a Write at each; whatever a crash leaves, the next Write
// converges to its payload, and a reader sees the old version or the new.
//
// Unlike the kubelet's writer, which removes the version it replaces at
// once, a Write keeps it until the next Write: a reader whose lookup
// resolved ..data just before the switch then still finds its file
// (removeOld says why). Beyond the kubelet's writer, a Write also removes what an interrupted one
// left (a ..data_tmp link, a half-written timestamped directory, the links
// of names dropped from the payload), and compares modes and owners, not
// only the content, to decide whether to write. The payload helpers
// (ConfigMapPayload, SecretPayload, FileUser, ProjectedMode) are the
// kubelet's MakePayload and the projected plugin's mode rule, shared by the
// plugins that use the writer. So are the rules on payload paths
// (ValidatePath, ValidateKeys, Nested): the plugins check a volume's paths
// with them when they resolve it, before anything is written.
package atomicwriter
