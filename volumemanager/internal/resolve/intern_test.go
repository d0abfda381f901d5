package resolve

import (
	"fmt"
	"reflect"
	"runtime"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// sameMap reports whether a and b are one map (not only equal ones).
func sameMap(a, b v1.ResourceList) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

// TestInternResourceLists: equal lists are shared, lists that differ in a
// name, a quantity's text or its format are not, nothing is shared once the
// table is full, and what is returned always holds what was given.
func TestInternResourceLists(t *testing.T) {
	list := func(kv ...string) v1.ResourceList {
		l := v1.ResourceList{}
		for i := 0; i < len(kv); i += 2 {
			l[v1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
		}
		return l
	}
	for _, tt := range []struct {
		name       string
		first, add v1.ResourceList
		max        int
		shared     bool
	}{
		{name: "equal: shared", first: list("storage", "10Gi"), add: list("storage", "10Gi"), max: 8, shared: true},
		{name: "equal with two names: shared", first: list("storage", "1Gi", "cpu", "1"), add: list("cpu", "1", "storage", "1Gi"), max: 8, shared: true},
		{name: "another size", first: list("storage", "10Gi"), add: list("storage", "20Gi"), max: 8},
		{name: "the same bytes in another format", first: list("storage", "1Gi"), add: list("storage", "1073741824"), max: 8},
		{name: "another name", first: list("storage", "1Gi"), add: list("ephemeral-storage", "1Gi"), max: 8},
		{name: "a name more", first: list("storage", "1Gi"), add: list("storage", "1Gi", "cpu", "1"), max: 8},
		{name: "table full: kept as it is", first: list("storage", "1Gi"), add: list("storage", "2Gi"), max: 1},
		{name: "empty: as it is", first: list("storage", "1Gi"), add: v1.ResourceList{}, max: 8},
	} {
		t.Run(tt.name, func(t *testing.T) {
			in := listInterner{max: tt.max}
			first := in.intern(tt.first)
			want := tt.add.DeepCopy()
			got := in.intern(tt.add)
			if s := sameMap(got, first); s != tt.shared {
				t.Errorf("shared = %v, want %v", s, tt.shared)
			}
			if !tt.shared && len(tt.add) > 0 && !sameMap(got, tt.add) {
				t.Error("a list not shared was replaced")
			}
			if len(got) != len(want) {
				t.Fatalf("got %v, want %v", got, want)
			}
			for name, q := range want {
				if g, ok := got[name]; !ok || g.String() != q.String() || g.Format != q.Format {
					t.Errorf("%s = %v, want %v", name, got[name], q)
				}
			}
		})
	}
	if got := (&listInterner{max: 8}).intern(nil); got != nil {
		t.Errorf("intern(nil) = %v, want nil", got)
	}
}

// TestInformerClaimBytes: the transform takes at least 1,500 bytes off
// each bound claim and volume of the same size the informers keep (most
// claims of a cluster share a few sizes): without sharing it took nothing
// off these (they have no managedFields), with it about 2,050, the claim's
// requests and capacity and the volume's capacity.
func TestInformerClaimBytes(t *testing.T) {
	if !measuringProcess(t) {
		return
	}
	const n = 2000
	objs := make([]any, 0, 2*n)
	for i := range n {
		pvc, pv := csitest.BoundClaim("ns", fmt.Sprintf("claim-%d", i), csitest.PVSpec{Driver: "drv.example.com", Handle: fmt.Sprintf("handle-%d", i)})
		objs = append(objs, pvc, pv)
	}
	before := liveBytes()
	for i := range objs {
		objs[i], _ = TrimInformerObject(objs[i])
	}
	// The objects are made, then trimmed: what is counted is what the
	// transform gives back for the informer to keep, against what it got.
	after := liveBytes()
	runtime.KeepAlive(objs)
	perPair := (float64(before) - float64(after)) / n
	t.Logf("transform: %.0f bytes less per claim and volume", perPair)
	const least = 1500
	if perPair < least {
		t.Errorf("the transform takes %.0f bytes off a claim and its volume, want at least %d", perPair, least)
	}
}
