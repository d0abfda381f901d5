package objectcache

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func volume(size string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv"},
		Spec: corev1.PersistentVolumeSpec{Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}}}
}

// getsOf counts the GETs of resource made so far.
func getsOf(a *api, resource string) int {
	n := 0
	for _, act := range a.Actions() {
		if act.GetVerb() == "get" && act.GetResource().Resource == resource {
			n++
		}
	}
	return n
}

// readsOf is where the reads of r's entry stand: its phase and the number
// of its wait.
func readsOf(c *Cache, r Ref) (getPhase, uint64) {
	c.mu.Lock()
	g := c.entries[r].get
	c.mu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.phase, g.wait
}

// TestVolumeReadOnCue: a PersistentVolume, once found, is not read every
// TTL as its claim is: it is read again when the claim bound to it
// changes (the resizer grows the volume, then marks the claim) and when a
// new holder holds it a TTL or more after its last read. The claim's
// reads that find it unchanged read no volume.
func TestVolumeReadOnCue(t *testing.T) {
	a := newAPI(claim("pv"), volume("1Gi"))
	fc := newFakeClock()
	c, changes := start(t, a, Config{Clock: fc, TTL: time.Minute})
	c.Hold("pod", pvcRef, pvRef)
	get(t, c, pvcRef)
	get(t, c, pvRef)
	for i := 2; i <= 4; i++ {
		eventually(t, "the claim's next read set", fc.HasWaiters)
		fc.Step(time.Minute)
		eventually(t, "the claim read again", func() bool { return getsOf(a, "persistentvolumeclaims") == i })
	}
	eventually(t, "the claim's next read set", fc.HasWaiters)
	if n := getsOf(a, "persistentvolumes"); n != 1 {
		t.Fatalf("the volume read %d times in three TTLs of an unchanged claim, want once", n)
	}

	// The resizer's part: the volume grown, then the claim marked.
	if err := a.Tracker().Update(corev1.SchemeGroupVersion.WithResource("persistentvolumes"), volume("2Gi"), ""); err != nil {
		t.Fatal(err)
	}
	marked := claim("pv")
	marked.Status.Conditions = []corev1.PersistentVolumeClaimCondition{{Type: corev1.PersistentVolumeClaimFileSystemResizePending, Status: corev1.ConditionTrue}}
	if err := a.Tracker().Update(corev1.SchemeGroupVersion.WithResource("persistentvolumeclaims"), marked, "ns"); err != nil {
		t.Fatal(err)
	}
	fc.Step(time.Minute)
	seen := map[Ref]bool{}
	for len(seen) < 2 {
		seen[recv(t, changes, "the claim's and the volume's changes")] = true
	}
	if !seen[pvcRef] || !seen[pvRef] {
		t.Fatalf("changes announced: %v, want the claim and the volume", seen)
	}
	if size := get(t, c, pvRef).(*corev1.PersistentVolume).Spec.Capacity[corev1.ResourceStorage]; size.Cmp(resource.MustParse("2Gi")) != 0 {
		t.Errorf("the volume's size after the claim's change: %s, want 2Gi", size.String())
	}
	if n := getsOf(a, "persistentvolumes"); n != 2 {
		t.Errorf("the volume read %d times, want twice", n)
	}

	// A new holder within a TTL of the last read shares it; one after
	// reads the volume again.
	c.Hold("pod2", pvRef)
	fc.Step(time.Minute)
	eventually(t, "the claim read again", func() bool { return getsOf(a, "persistentvolumeclaims") == 6 && fc.HasWaiters() })
	if n := getsOf(a, "persistentvolumes"); n != 2 {
		t.Fatalf("the volume read %d times after a new holder within the TTL, want still 2", n)
	}
	c.Hold("pod3", pvRef)
	eventually(t, "the volume read for its new holder", func() bool { return getsOf(a, "persistentvolumes") == 3 })

	// A read on cue is not served from the API server's cache, whose
	// volumes may lag behind its claims; the claim's refreshes are.
	var cached []string
	acts := a.Actions() // every one a GET, in the order of a.gets
	a.mu.Lock()
	for i, opts := range a.gets {
		if opts.ResourceVersion == "0" {
			cached = append(cached, acts[i].GetResource().Resource)
		}
	}
	a.mu.Unlock()
	if want := slices.Repeat([]string{"persistentvolumeclaims"}, 5); !slices.Equal(cached, want) {
		t.Errorf("reads from the API server's cache: %v, want the claim's 5 refreshes only", cached)
	}
}

// TestMissingVolumeReadEveryTTL: a volume not found is read every TTL, as
// any object, until it appears; from then on only on cue.
func TestMissingVolumeReadEveryTTL(t *testing.T) {
	a := newAPI(claim("pv"))
	fc := newFakeClock()
	c, changes := start(t, a, Config{Clock: fc, TTL: time.Minute})
	c.Hold("pod", pvcRef, pvRef)
	get(t, c, pvcRef)
	eventually(t, "both reads waiting", func() bool {
		return getsOf(a, "persistentvolumes") == 1 && getsOf(a, "persistentvolumeclaims") == 1 && fc.Waiters() == 2
	})
	fc.Step(time.Minute)
	eventually(t, "the missing volume read again", func() bool { return getsOf(a, "persistentvolumes") == 2 && fc.Waiters() == 2 })
	if err := a.Tracker().Add(volume("1Gi")); err != nil {
		t.Fatal(err)
	}
	fc.Step(time.Minute)
	if r := recv(t, changes, "the volume appeared"); r != pvRef {
		t.Fatalf("OnChange(%s), want the volume", r)
	}
	eventually(t, "the volume found and waiting for a cue", func() bool { return getsOf(a, "persistentvolumes") == 3 && fc.Waiters() == 1 })
	fc.Step(time.Minute)
	eventually(t, "the claim read again", func() bool { return getsOf(a, "persistentvolumeclaims") == 4 && fc.HasWaiters() })
	if n := getsOf(a, "persistentvolumes"); n != 3 {
		t.Errorf("the found volume read %d times, want 3 (no read after it was found)", n)
	}
}

// TestCueDuringRead: a cue that comes while the volume is being read
// (which may have read it before the change the cue is for) reads it
// again once that read ends.
func TestCueDuringRead(t *testing.T) {
	a := newAPI(volume("1Gi"))
	fc := newFakeClock()
	c, _ := start(t, a, Config{Clock: fc, TTL: time.Minute})
	c.Hold("pod", pvRef)
	get(t, c, pvRef)
	g := newGate(a, "persistentvolumes")
	fc.Step(time.Minute) // a new holder reads it again
	c.Hold("pod2", pvRef)
	eventually(t, "the new holder's read running", func() bool {
		phase, _ := readsOf(c, pvRef)
		return phase == getReading
	})
	c.Hold("pod3", pvRef)
	close(g.open)
	eventually(t, "the volume read again after the read the cue came during", func() bool { return getsOf(a, "persistentvolumes") == 3 })
}

// TestTTLJitter: with TTLJitter 0.5 each refresh comes between the TTL
// and 1.5 TTL after the last read, not always at the TTL.
func TestTTLJitter(t *testing.T) {
	a := newAPI(claim(""))
	fc := newFakeClock()
	c, _ := start(t, a, Config{Clock: fc, TTL: time.Minute, TTLJitter: 0.5})
	c.Hold("pod", pvcRef)
	delays := map[time.Duration]bool{}
	for i := 1; i <= 8; i++ {
		eventually(t, "the read done and the next set", func() bool { return getsOf(a, "persistentvolumeclaims") == i && fc.HasWaiters() })
		_, wait := readsOf(c, pvcRef)
		waited := time.Duration(0)
		for { // the timer fires (synchronously) at the step that reaches it
			if phase, w := readsOf(c, pvcRef); phase != getWaiting || w != wait {
				break
			}
			if waited > 90*time.Second {
				t.Fatalf("refresh %d not due %s after the read, want at most 1.5 TTL", i, waited)
			}
			fc.Step(time.Second)
			waited += time.Second
		}
		if waited < time.Minute {
			t.Fatalf("refresh %d after %s, want at least the TTL", i, waited)
		}
		delays[waited] = true
	}
	if len(delays) < 2 {
		t.Errorf("every refresh after %v: not jittered", delays)
	}
}
