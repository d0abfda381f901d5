package planner

import (
	"errors"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volumemanager/internal/state"
)

// testPV is PV "pv" of size (none: no capacity), bound to claim ns/c.
func testPV(size string) *v1.PersistentVolume {
	pv := &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv"},
		Spec: v1.PersistentVolumeSpec{ClaimRef: &v1.ObjectReference{Namespace: "ns", Name: "c"}}}
	if size != "" {
		pv.Spec.Capacity = v1.ResourceList{v1.ResourceStorage: resource.MustParse(size)}
	}
	return pv
}

// testPVC is claim ns/c bound to PV "pv", ReadWriteOnce, whose status
// reports capacity.
func testPVC(capacity string) *v1.PersistentVolumeClaim {
	return &v1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c", ResourceVersion: "1"},
		Spec:   v1.PersistentVolumeClaimSpec{VolumeName: "pv", AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}},
		Status: v1.PersistentVolumeClaimStatus{Capacity: v1.ResourceList{v1.ResourceStorage: resource.MustParse(capacity)}}}
}

// grownTo are the facts of a PV grown to size whose claim (at half of
// it) asks the node to expand (FileSystemResizePending).
func grownTo(size int64) ExpansionFacts {
	pv := testPV("1")
	pv.Spec.Capacity[v1.ResourceStorage] = *resource.NewQuantity(size, resource.BinarySI)
	pvc := testPVC("1")
	pvc.Status.Capacity[v1.ResourceStorage] = *resource.NewQuantity(size/2, resource.BinarySI)
	pvc.Status.Conditions = []v1.PersistentVolumeClaimCondition{{Type: v1.PersistentVolumeClaimFileSystemResizePending, Status: v1.ConditionTrue}}
	return ExpansionFacts{Expands: true, PV: pv, PVC: pvc}
}

// expanding is a wanted volume, staged, with pod a's publish Mounted.
func expanding(f ExpansionFacts, size int64) View {
	a := podvol.PodVolume{Pod: podvol.PodRef{UID: "a", Namespace: "ns", Name: "a"}, SpecName: "data"}
	return View{Name: "v", Desired: []podvol.PodVolume{a}, Known: true, Caps: attachStage, Expansion: f,
		Actual: state.ActualVolume{Attached: true, DeviceState: podvol.Mounted, Size: size, Pods: map[types.UID]state.PodMount{"a": {Volume: a, State: podvol.Mounted}}}}
}

// TestPendingExpansion: when a node expansion is due on a node that has
// the volume at the claim's status capacity, and to what size.
func TestPendingExpansion(t *testing.T) {
	withAllocated := func(c *v1.PersistentVolumeClaim, size string) *v1.PersistentVolumeClaim {
		c.Status.AllocatedResources = v1.ResourceList{v1.ResourceStorage: resource.MustParse(size)}
		return c
	}
	pvc := func(size string, pending bool, allocated v1.ClaimResourceStatus) *v1.PersistentVolumeClaim {
		c := testPVC(size)
		if pending {
			c.Status.Conditions = []v1.PersistentVolumeClaimCondition{{Type: v1.PersistentVolumeClaimFileSystemResizePending, Status: v1.ConditionTrue}}
		}
		if allocated != "" {
			c.Status.AllocatedResourceStatuses = map[v1.ResourceName]v1.ClaimResourceStatus{v1.ResourceStorage: allocated}
		}
		return c
	}
	pv := testPV
	tests := []struct {
		name string
		pvc  *v1.PersistentVolumeClaim
		pv   *v1.PersistentVolume
		want bool
		to   string // the size grown to, when due
	}{
		{"grown, FileSystemResizePending", pvc("1Gi", true, ""), pv("2Gi"), true, "2Gi"},
		{"grown, NodeResizePending", pvc("1Gi", false, v1.PersistentVolumeClaimNodeResizePending), pv("2Gi"), true, "2Gi"},
		{"grown, controller not done", pvc("1Gi", false, v1.PersistentVolumeClaimControllerResizeInProgress), pv("2Gi"), false, ""},
		{"grown, NodeResizeInProgress (a retry)", pvc("1Gi", false, v1.PersistentVolumeClaimNodeResizeInProgress), pv("2Gi"), true, "2Gi"},
		{"grown, NodeResizeInfeasible despite FileSystemResizePending", pvc("1Gi", true, v1.PersistentVolumeClaimNodeResizeInfeasible), pv("2Gi"), false, ""},
		{"grown, nothing pending", pvc("1Gi", false, ""), pv("2Gi"), false, ""},
		{"same size", pvc("2Gi", true, ""), pv("2Gi"), false, ""},
		{"NodeResizePending read before the grown PV", pvc("1Gi", false, v1.PersistentVolumeClaimNodeResizePending), pv("1Gi"), false, ""},
		{"NodeResizeInProgress, PV not grown in the lister yet", pvc("1Gi", false, v1.PersistentVolumeClaimNodeResizeInProgress), pv("1Gi"), false, ""},
		{"PV without capacity", pvc("1Gi", true, ""), pv(""), false, ""},
		{"allocated: grown to it", withAllocated(pvc("1Gi", false, v1.PersistentVolumeClaimNodeResizePending), "2Gi"), pv("2Gi"), true, "2Gi"},
		{"allocated lowered after a failure: grown to it, not to the PV's", withAllocated(pvc("1Gi", false, v1.PersistentVolumeClaimNodeResizePending), "5Gi"), pv("9Gi"), true, "5Gi"},
		{"allocated above the PV's: the PV not grown in the lister yet", withAllocated(pvc("1Gi", false, v1.PersistentVolumeClaimNodeResizePending), "2Gi"), pv("1Gi"), false, ""},
		{"allocated, NodeResizeInfeasible", withAllocated(pvc("1Gi", false, v1.PersistentVolumeClaimNodeResizeInfeasible), "9Gi"), pv("9Gi"), false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Plan(expanding(ExpansionFacts{Expands: true, PV: tt.pv, PVC: tt.pvc}, 0))
			if got := d.Expansion != nil; got != tt.want {
				t.Fatalf("expansion due = %v, want %v (plan %q)", got, tt.want, actions(d))
			}
			if want := tt.pvc.Status.Capacity.Storage().Value(); d.NodeSize != want {
				t.Errorf("NodeSize = %d, want the claim's status capacity %d", d.NodeSize, want)
			}
			if !tt.want {
				if actions(d) != "" {
					t.Errorf("plan = %q, want nothing", actions(d))
				}
				return
			}
			if q := resource.MustParse(tt.to); d.Expansion.Size != q.Value() || d.Expansion.From != d.NodeSize {
				t.Errorf("expansion = %+v, want to %s from %d", *d.Expansion, tt.to, d.NodeSize)
			}
			if actions(d) != "volume_fs_resize v" {
				t.Errorf("plan = %q, want the expansion", actions(d))
			}
		})
	}
}

// TestExpansionDecision: a node expansion is looked for only for a wanted
// volume set up on the node (known, its capabilities known, staged when
// it stages); the first look records the claim's status capacity as the
// node's size; an expansion held is not asked again at that size while
// the claim is at the version it was held at, and the hold ends when the
// claim moves on.
func TestExpansionDecision(t *testing.T) {
	const gi = int64(1 << 30)
	held := func(h ExpandHold) ExpansionFacts {
		f := grownTo(2 * gi)
		f.Held = h
		return f
	}
	for _, tc := range []struct {
		name     string
		view     func(v *View)
		size     int64 // Actual.Size
		facts    ExpansionFacts
		due      bool
		nodeSize int64
		forget   bool
	}{
		{name: "due, size not known: the claim's", facts: grownTo(2 * gi), due: true, nodeSize: gi},
		{name: "due, size known: kept", facts: grownTo(2 * gi), size: gi, due: true},
		{name: "node has the size already", facts: grownTo(2 * gi), size: 2 * gi},
		{name: "node cannot expand", facts: ExpansionFacts{PV: testPV("2Gi"), PVC: testPVC("1Gi")}},
		{name: "no claim: nothing due, size not known stays", facts: ExpansionFacts{Expands: true}},
		{name: "not wanted", facts: grownTo(2 * gi), view: func(v *View) { v.Desired = nil }},
		{name: "not known", facts: grownTo(2 * gi), view: func(v *View) { v.Known = false }},
		{name: "capabilities not known", facts: grownTo(2 * gi), view: func(v *View) { v.CapsErr = errors.New("driver drv not registered") }},
		{name: "not staged yet", facts: grownTo(2 * gi), view: func(v *View) { v.Actual.DeviceState = podvol.Uncertain }},
		{name: "not staged, plugin does not stage", facts: grownTo(2 * gi), due: true, nodeSize: gi,
			view: func(v *View) { v.Actual.DeviceState, v.Caps.Stages = podvol.NotMounted, false }},
		{name: "held at this version", facts: held(ExpandHold{Size: 2 * gi, ClaimRV: "1"}), nodeSize: gi},
		{name: "held at any version", facts: held(ExpandHold{Size: 2 * gi}), nodeSize: gi},
		{name: "held at another size", facts: held(ExpandHold{Size: 3 * gi}), due: true, nodeSize: gi},
		{name: "held at another version: forgotten, due", facts: held(ExpandHold{Size: 2 * gi, ClaimRV: "0"}), due: true, nodeSize: gi, forget: true},
		{name: "held, no claim: forgotten", facts: ExpansionFacts{Expands: true, Held: ExpandHold{Size: 2 * gi, ClaimRV: "1"}}, forget: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := expanding(tc.facts, tc.size)
			if tc.view != nil {
				tc.view(&v)
			}
			d := Plan(v)
			if got := d.Expansion != nil; got != tc.due {
				t.Errorf("due = %v, want %v (plan %q, waiting %q)", got, tc.due, actions(d), d.Waiting)
			}
			if d.NodeSize != tc.nodeSize || d.ForgetExpandHold != tc.forget {
				t.Errorf("NodeSize = %d, ForgetExpandHold = %v; want %d, %v", d.NodeSize, d.ForgetExpandHold, tc.nodeSize, tc.forget)
			}
		})
	}
}

func TestNodeExpansionDue(t *testing.T) {
	const gi = int64(1 << 30)
	claim := func(access v1.PersistentVolumeAccessMode, capacity string, status v1.ClaimResourceStatus, annotated bool) *v1.PersistentVolumeClaim {
		c := testPVC(capacity)
		c.Spec.AccessModes = []v1.PersistentVolumeAccessMode{access}
		if status != "" {
			c.Status.AllocatedResourceStatuses = map[v1.ResourceName]v1.ClaimResourceStatus{v1.ResourceStorage: status}
		}
		if annotated {
			c.Annotations = map[string]string{NodeExpansionNotRequired: "true"}
		}
		return c
	}
	tests := []struct {
		name           string
		pvc            *v1.PersistentVolumeClaim
		nodeSize       int64
		due, claimDone bool
	}{
		{"RWX grown elsewhere, node at the old size", claim(v1.ReadWriteMany, "2Gi", "", false), gi, true, true},
		{"RWX grown elsewhere, node at the new size", claim(v1.ReadWriteMany, "2Gi", "", false), 2 * gi, false, true},
		{"RWX grown elsewhere, annotated", claim(v1.ReadWriteMany, "2Gi", "", true), gi, false, true},
		{"RWO grown by the controller alone", claim(v1.ReadWriteOnce, "2Gi", "", false), gi, false, true},
		{"RWX pending on the claim", claim(v1.ReadWriteMany, "1Gi", v1.PersistentVolumeClaimNodeResizePending, false), gi, true, false},
		{"RWX pending on the claim, annotated", claim(v1.ReadWriteMany, "1Gi", v1.PersistentVolumeClaimNodeResizePending, true), gi, true, false},
		{"RWO pending, node already expanded", claim(v1.ReadWriteOnce, "1Gi", v1.PersistentVolumeClaimNodeResizeInProgress, false), 2 * gi, false, false},
		{"RWX capacity reported with a resize status", claim(v1.ReadWriteMany, "2Gi", v1.PersistentVolumeClaimNodeResizeInProgress, false), gi, false, false},
		{"RWX infeasible", claim(v1.ReadWriteMany, "1Gi", v1.PersistentVolumeClaimNodeResizeInfeasible, false), gi, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			due, done := NodeExpansionDue(tt.pvc, resource.MustParse("2Gi"), tt.nodeSize)
			if due != tt.due || done != tt.claimDone {
				t.Errorf("NodeExpansionDue = %v, %v; want %v, %v", due, done, tt.due, tt.claimDone)
			}
		})
	}
}
