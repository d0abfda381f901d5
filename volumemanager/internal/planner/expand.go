package planner

import (
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/nodevol/nodevol/podvol"
)

// NodeExpansionNotRequired is the claim annotation that says a
// ReadWriteMany volume the claim's status already reports grown needs no
// expansion on each node that mounts it (the kubelet's
// NodeExpansionNotRequired).
const NodeExpansionNotRequired = "volume.kubernetes.io/node-expansion-not-required"

// expansion decides the node expansion of a wanted volume once it is set
// up (staged, or published when it does not stage), as the kubelet's
// volume manager does (its InitializeClaimSize and the node expander's
// runPreCheck), and returns the size to grow it to (0: none is due).
//
// The first look since the volume was set up here (or found again after a
// restart) takes the claim's status capacity for the size the node has the
// volume at (Decision.NodeSize). A node expansion is looked for once the
// PV has grown beyond that size; it grows the volume to ExpansionTarget
// when NodeExpansionDue says so, unless it is the one held
// (ExpansionFacts.Held). A hold for another version of the claim ends
// (Decision.ForgetExpandHold): the claim has moved on, and says what is
// due.
func expansion(v View, d *Decision) int64 {
	f := v.Expansion
	if !f.Expands || !ExpansionLooked(v) {
		return 0
	}
	var e Expansion
	due := false
	e.From = v.Actual.Size
	if f.PV != nil && f.PVC != nil {
		if e.From == 0 {
			have := f.PVC.Status.Capacity[v1.ResourceStorage]
			e.From = have.Value()
		}
		if pvSize, ok := f.PV.Spec.Capacity[v1.ResourceStorage]; ok && pvSize.Value() > e.From {
			size := ExpansionTarget(f.PVC, pvSize)
			due, _ = NodeExpansionDue(f.PVC, size, e.From)
			e.Size, e.ClaimRV, e.Namespace, e.Claim, e.PV = size.Value(), f.PVC.ResourceVersion, f.PVC.Namespace, f.PVC.Name, f.PV.Name
		}
	}
	if v.Actual.Size == 0 && e.From > 0 {
		d.NodeSize = e.From
	}
	held := f.Held
	if held.ClaimRV != "" && held.ClaimRV != e.ClaimRV {
		d.ForgetExpandHold = true
		held = ExpandHold{}
	}
	if !due || held.holds(e.Size, e.ClaimRV) {
		return 0
	}
	d.Expansion = &e
	return e.Size
}

// ExpansionLooked reports whether the planner looks for a node expansion
// of v's volume: wanted, known here and set up (staged, or published when
// it does not stage). The loop reads the claim and the PV
// (View.Expansion) only then, not for every volume it plans.
func ExpansionLooked(v View) bool {
	return len(v.Desired) > 0 && v.Known && v.CapsErr == nil && (v.Actual.DeviceState == podvol.Mounted || !v.Caps.Stages)
}

// NodeExpansionDue reports whether this node, which has the claim's volume
// at nodeSize bytes, is to grow it to size, as the kubelet's node expander
// decides it before NodeExpandVolume (runPreCheck); claimDone says that
// the claim's status already reports size with no resize status: another
// node or the controller alone finished, and the node writes nothing on
// the claim. The expansion is due when the claim asks for it
// (claimNodeResizePending), or, for a claim already done, when the volume
// is ReadWriteMany and the claim does not say
// volume.kubernetes.io/node-expansion-not-required: every node that
// mounts a shared volume grows its own view of it (kubernetes#131907). A
// node that has the volume at size already has nothing to do. The
// planner decides with it, and the expansion checks it again with the
// claim read afresh before it starts.
func NodeExpansionDue(pvc *v1.PersistentVolumeClaim, size resource.Quantity, nodeSize int64) (due, claimDone bool) {
	have := pvc.Status.Capacity[v1.ResourceStorage]
	_, resizing := pvc.Status.AllocatedResourceStatuses[v1.ResourceStorage]
	claimDone = !resizing && have.Cmp(size) >= 0
	if nodeSize >= size.Value() {
		return false, claimDone
	}
	if claimDone {
		_, notRequired := pvc.Annotations[NodeExpansionNotRequired]
		return slices.Contains(pvc.Spec.AccessModes, v1.ReadWriteMany) && !notRequired, true
	}
	return claimNodeResizePending(pvc, size), false
}

// claimNodeResizePending reports whether the claim asks the node to grow
// its volume to size, as the kubelet's node expander decides it: its status
// capacity is below size, and its storage resize status says NodeResizePending or
// NodeResizeInProgress (a node expansion that was cut short or failed and
// is retried); any other status (NodeResizeInfeasible above all) says no,
// until the claim changes. A claim without a resize status (an older
// external-resizer) asks while its status capacity is below size and it
// has the FileSystemResizePending condition.
func claimNodeResizePending(pvc *v1.PersistentVolumeClaim, size resource.Quantity) bool {
	// The claim's capacity must be below the PV's in every case: the claim
	// and the PV come through two informers, and a claim marked pending may
	// arrive before the grown PV (the resizer updates the PV first). Read
	// with the old PV, the node would "expand" to the old size and clear
	// the claim's status; the PV's event plans the volume again.
	have := pvc.Status.Capacity[v1.ResourceStorage]
	if have.Cmp(size) >= 0 {
		return false
	}
	if st, ok := pvc.Status.AllocatedResourceStatuses[v1.ResourceStorage]; ok {
		return st == v1.PersistentVolumeClaimNodeResizePending || st == v1.PersistentVolumeClaimNodeResizeInProgress
	}
	for _, c := range pvc.Status.Conditions {
		if c.Type == v1.PersistentVolumeClaimFileSystemResizePending && c.Status == v1.ConditionTrue {
			return true
		}
	}
	return false
}

// ExpansionTarget is the size a node expansion of pvc's volume grows it
// to, as the kubelet's node expander takes it: the claim's allocated size
// when the claim carries one (the external-resizer of
// RecoverVolumeExpansionFailure sets it, and lowers it when the user
// recovers from a failed expansion by asking for less), else pvSize, the
// PV's capacity (an older resizer).
func ExpansionTarget(pvc *v1.PersistentVolumeClaim, pvSize resource.Quantity) resource.Quantity {
	if alloc, ok := pvc.Status.AllocatedResources[v1.ResourceStorage]; ok && !alloc.IsZero() {
		return alloc
	}
	return pvSize
}
