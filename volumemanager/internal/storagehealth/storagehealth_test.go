package storagehealth

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestUpdateStorageHealth steps one driver's storage health through
// changes: a write only when the set of (status, reason, access mode,
// volume mode) changes, never for a new message alone; the other driver's
// entry untouched; a condition that stays keeps its lastTransitionTime;
// healthy removes the entry. A missing CSINode is an error.
func TestUpdateStorageHealth(t *testing.T) {
	ctx := context.Background()
	other := storagev1.StorageHealth{Name: "other", HealthConditions: []storagev1.StorageHealthCondition{{Status: storagev1.StorageDegraded, Reason: "Slow"}}}
	client := fake.NewClientset(&storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: "n"},
		Status:     storagev1.CSINodeStatus{StorageHealth: []storagev1.StorageHealth{other}},
	})
	rwo := corev1.ReadWriteOnce
	down := storagev1.StorageHealthCondition{Status: storagev1.StorageUnreachable, Reason: "Down", Message: "no path"}
	rwoSlow := storagev1.StorageHealthCondition{Status: storagev1.StorageDegraded, Reason: "Slow", AccessMode: &rwo}
	at := func(c storagev1.StorageHealthCondition, t metav1.Time) storagev1.StorageHealthCondition {
		c.LastTransitionTime = t
		return c
	}
	t0 := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	t1, t2, t3 := metav1.NewTime(t0.Add(time.Minute)), metav1.NewTime(t0.Add(2*time.Minute)), metav1.NewTime(t0.Add(3*time.Minute))
	steps := []struct {
		name  string
		conds []storagev1.StorageHealthCondition
		now   metav1.Time
		wrote bool
		want  []storagev1.StorageHealthCondition // d's entry; nil: none
	}{
		{"healthy, no entry", nil, t0, false, nil},
		{"unreachable", []storagev1.StorageHealthCondition{down}, t0, true, []storagev1.StorageHealthCondition{at(down, t0)}},
		{"new message only", []storagev1.StorageHealthCondition{{Status: down.Status, Reason: down.Reason, Message: "still no path"}}, t1, false,
			[]storagev1.StorageHealthCondition{at(down, t0)}},
		{"one more", []storagev1.StorageHealthCondition{rwoSlow, down}, t2, true,
			[]storagev1.StorageHealthCondition{at(rwoSlow, t2), at(down, t0)}},
		{"same set, other order", []storagev1.StorageHealthCondition{down, rwoSlow}, t3, false,
			[]storagev1.StorageHealthCondition{at(rwoSlow, t2), at(down, t0)}},
		{"healthy", nil, t3, true, nil},
		{"healthy again", []storagev1.StorageHealthCondition{}, t3, false, nil},
	}
	for _, s := range steps {
		client.ClearActions()
		wrote, err := Update(ctx, client, "n", "d", s.conds, s.now)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		updates := 0
		for _, a := range client.Actions() {
			if a.GetVerb() == "update" {
				updates++
				if a.GetSubresource() != "status" {
					t.Errorf("%s: update of %q, want the status subresource", s.name, a.GetSubresource())
				}
			}
		}
		if wrote != s.wrote || updates != map[bool]int{false: 0, true: 1}[s.wrote] {
			t.Errorf("%s: wrote %v with %d updates, want %v", s.name, wrote, updates, s.wrote)
		}
		cn, err := client.StorageV1().CSINodes().Get(ctx, "n", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		want := []storagev1.StorageHealth{other}
		if s.want != nil {
			want = append(want, storagev1.StorageHealth{Name: "d", HealthConditions: s.want})
		}
		if diff := cmp.Diff(want, cn.Status.StorageHealth); diff != "" {
			t.Errorf("%s: storageHealth (-want +got):\n%s", s.name, diff)
		}
	}
	if _, err := Update(ctx, client, "missing", "d", []storagev1.StorageHealthCondition{down}, t0); !apierrors.IsNotFound(err) {
		t.Errorf("missing CSINode: %v, want NotFound", err)
	}
}
