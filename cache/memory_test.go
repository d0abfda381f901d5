package cache

import (
	"fmt"
	"runtime"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

// liveBytes returns the bytes of live heap objects after a collection.
func liveBytes() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestDesiredStateBytesPerVolume holds the desired state's own cost of a
// pod with one volume (the common case at scale) under a bound: it was
// 1.7 KiB, most of it the room for 8 PodVolume values of the volume's pod
// map and an empty error map per pod.
func TestDesiredStateBytesPerVolume(t *testing.T) {
	const n = 4000
	// The inputs are made first: only what SetPod keeps is counted.
	refs := make([]PodRef, n)
	vols := make([][]DesiredVolume, n)
	wanted := []string{"data"}
	for i := range refs {
		refs[i] = PodRef{UID: types.UID(fmt.Sprintf("uid-%d", i)), Namespace: "ns", Name: fmt.Sprintf("pod-%d", i)}
		name := fmt.Sprintf("pv-%d", i)
		vols[i] = []DesiredVolume{{
			Spec:   spec("drv", name, name),
			Volume: PodVolume{SpecName: "data"},
		}}
	}
	d := NewDesiredStateOfWorld(nil)
	before := liveBytes()
	for i := range refs {
		d.SetPod(refs[i], wanted, vols[i], nil)
	}
	after := liveBytes()
	runtime.KeepAlive(d)
	perVolume := float64(after-before) / n
	t.Logf("desired state: %.0f bytes per pod with one volume", perVolume)
	const limit = 900
	if perVolume > limit {
		t.Errorf("desired state keeps %.0f bytes per pod with one volume, want at most %d", perVolume, limit)
	}
}
