package volume

// In-tree kinds the kubelet v1.37 still mounts and nodevol does not.
//
// The kubelet still registers its iscsi and fc plugins. nodevol leaves
// them out: each needs the host's initiator tools (iscsiadm and the
// iscsid daemon, multipath, the SCSI rescans of an HBA) and a real SAN to
// be tested against, and Kubernetes' own path for them is a CSI driver,
// which nodevol mounts. A pod volume or PV of such a kind stays a final
// error, and the error names what replaces the kind.

// replacements names, for a kind of source nodevol has no plugin for,
// the CSI driver a user moves its volumes to (by the source's JSON name,
// as SourceKind and PVSourceKind spell it).
var replacements = map[string]string{
	// The kubernetes-csi project's own iSCSI driver.
	"iscsi": `nodevol does not mount iscsi volumes in-tree: use the CSI driver "iscsi.csi.k8s.io" (kubernetes-csi/csi-driver-iscsi)`,
	// kubernetes-csi has no Fibre Channel driver (its old examples
	// repository's fc driver is archived); FC arrays ship their own.
	"fc": "nodevol does not mount fc (Fibre Channel) volumes in-tree: use your storage vendor's CSI driver (kubernetes-csi has no Fibre Channel driver)",
}

// replacedBy says what replaces kind, a kind of volume source nodevol has
// no plugin for (iscsi, fc), as a sentence for an error; "" for any
// other kind.
func replacedBy(kind string) string { return replacements[kind] }

// hint is ReplacedBy(kind) as the tail of an error: "; " and the sentence,
// or "".
func hint(kind string) string {
	if s := replacedBy(kind); s != "" {
		return "; " + s
	}
	return ""
}
