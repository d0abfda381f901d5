package resolve

import (
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

// TestSetPending: the claims pods wait for follow each pod's resolution and
// deletion, each claim's pods apart from another's, and nothing is kept
// for a pod that waits for nothing.
func TestSetPending(t *testing.T) {
	pt := NewTable(nil, nil)
	steps := []struct {
		name         string
		uid          types.UID
		claims       []string
		wantA, wantB []types.UID
	}{
		{"p1 waits for a", "p1", []string{"ns/a"}, []types.UID{"p1"}, nil},
		{"p2 waits for a and b", "p2", []string{"ns/a", "ns/b"}, []types.UID{"p1", "p2"}, []types.UID{"p2"}},
		{"p1 now waits for b", "p1", []string{"ns/b"}, []types.UID{"p2"}, []types.UID{"p1", "p2"}},
		{"p2 waits for nothing", "p2", nil, nil, []types.UID{"p1"}},
		{"p1 is forgotten", "p1", nil, nil, nil},
	}
	for _, s := range steps {
		pt.setPending(s.uid, s.claims)
		for claim, want := range map[string][]types.UID{"ns/a": s.wantA, "ns/b": s.wantB} {
			got := pt.WaitingFor(claim)
			slices.Sort(got)
			if !slices.Equal(got, want) && (len(got) != 0 || len(want) != 0) {
				t.Errorf("%s: waitingFor(%s) = %v, want %v", s.name, claim, got, want)
			}
		}
	}
	if len(pt.pending) != 0 || len(pt.waiting) != 0 {
		t.Errorf("left: pending %v, waiting %v", pt.pending, pt.waiting)
	}
}
