package state

import (
	"fmt"
	"runtime"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/podvol"
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
	refs := make([]podvol.PodRef, n)
	vols := make([][]DesiredVolume, n)
	wanted := []string{"data"}
	for i := range refs {
		refs[i] = podvol.PodRef{UID: types.UID(fmt.Sprintf("uid-%d", i)), Namespace: "ns", Name: fmt.Sprintf("pod-%d", i)}
		name := fmt.Sprintf("pv-%d", i)
		vols[i] = []DesiredVolume{{
			Spec:   spec("drv", name, name),
			Volume: podvol.PodVolume{SpecName: "data"},
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

// TestStatesShrink: after most volumes are gone, the desired and actual
// states give back the room their maps had for them (a Go map never
// shrinks by itself), and what is left is still there.
func TestStatesShrink(t *testing.T) {
	// Without shrinking the maps keep about 740 KB (desired) and 410 KB
	// (actual) for the 4,000 pods that were; with it, the tables of the last
	// rebuild (under 1,024 entries, minShrink) are left: 160 and 80 KB.
	const n, left, limit = 4000, 10, 300 << 10
	refs := make([]podvol.PodRef, n)
	vols := make([][]DesiredVolume, n)
	for i := range refs {
		refs[i] = podvol.PodRef{UID: types.UID(fmt.Sprintf("uid-%d", i)), Namespace: "ns", Name: fmt.Sprintf("pod-%d", i)}
		name := fmt.Sprintf("pv-%d", i)
		vols[i] = []DesiredVolume{{Spec: spec("drv", name, name), Volume: podvol.PodVolume{SpecName: "data", Pod: refs[i]}}}
	}
	wanted := []string{"data"}

	t.Run("desired", func(t *testing.T) {
		before := liveBytes()
		d := NewDesiredStateOfWorld(nil)
		for i := range refs {
			d.SetPod(refs[i], wanted, vols[i], nil)
		}
		for i := left; i < n; i++ {
			d.DeletePod(refs[i].UID)
		}
		kept := int64(liveBytes()) - int64(before)
		for i := range left {
			if _, ok := d.Pod(refs[i].UID); !ok {
				t.Errorf("pod %s lost", refs[i].UID)
			}
			if _, ok := d.VolumeForPV(vols[i][0].Spec.PVName); !ok {
				t.Errorf("PV %s lost", vols[i][0].Spec.PVName)
			}
		}
		runtime.KeepAlive(d)
		runtime.KeepAlive(vols) // the inputs are not counted: alive throughout
		t.Logf("desired state: %d bytes kept for %d pods left of %d", kept, left, n)
		if kept > limit {
			t.Errorf("desired state keeps %d bytes for %d pods left of %d, want at most %d", kept, left, n, limit)
		}
	})
	t.Run("actual", func(t *testing.T) {
		before := liveBytes()
		a := NewActualStateOfWorld()
		for i := range refs {
			a.SetPodMount(vols[i][0].Spec, vols[i][0].Volume, podvol.Mounted, "/pods/"+string(refs[i].UID))
		}
		for i := left; i < n; i++ {
			a.DeletePodMount(vols[i][0].Spec.Name, refs[i].UID)
			a.DeleteVolume(vols[i][0].Spec.Name)
		}
		kept := int64(liveBytes()) - int64(before)
		for i := range left {
			if got := a.PodVolumes(refs[i].UID); len(got) != 1 {
				t.Errorf("pod %s has %d volumes, want 1", refs[i].UID, len(got))
			}
		}
		runtime.KeepAlive(a)
		runtime.KeepAlive(vols)
		t.Logf("actual state: %d bytes kept for %d pods left of %d", kept, left, n)
		if kept > limit {
			t.Errorf("actual state keeps %d bytes for %d pods left of %d, want at most %d", kept, left, n, limit)
		}
	})
}

// TestShrink: when shrink copies a map, and that the copy holds the same.
func TestShrink(t *testing.T) {
	for _, tt := range []struct {
		name       string
		peak, size int
		copied     bool
		peakAfter  int
	}{
		{"growing: the peak follows", 10, 20, false, 20},
		{"small peak: never copied", minShrink - 1, 1, false, minShrink - 1},
		{"a quarter of the peak: kept", 4000, 1000, false, 4000},
		{"under a quarter: copied", 4000, 999, true, 999},
		{"empty after a large peak: copied", 4000, 0, true, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := make(map[int]int, tt.size)
			for i := range tt.size {
				m[i] = i * 2
			}
			s := shrinking{peak: tt.peak}
			m[-1] = 0 // a marker to tell a copy from m
			delete(m, -1)
			got := shrink(&s, m)
			m[-1] = 1
			_, shared := got[-1]
			if copied := !shared; copied != tt.copied {
				t.Errorf("copied = %v, want %v", copied, tt.copied)
			}
			delete(m, -1)
			if len(got) != tt.size {
				t.Errorf("copy holds %d entries, want %d", len(got), tt.size)
			}
			for k, v := range m {
				if got[k] != v {
					t.Errorf("copy[%d] = %d, want %d", k, got[k], v)
				}
			}
			if s.peak != tt.peakAfter {
				t.Errorf("peak = %d, want %d", s.peak, tt.peakAfter)
			}
		})
	}
}

// TestActualStateBytesPerVolume holds the actual state's own cost of a
// mounted volume with one pod under a bound: it was 745 bytes, of which
// about 190 the per-pod index set (a map has room for 8 from its first
// entry), now a slice. The volume's Pods map is not the 8 x 152-byte
// PodMount values it looks like: Go keeps a map's values over 128 bytes
// out of line, so its slots hold pointers (about 410 bytes with the
// PodMount).
func TestActualStateBytesPerVolume(t *testing.T) {
	const n = 4000
	// The inputs are made first: only what the actual state keeps is counted.
	specs := make([]podvol.VolumeSpec, n)
	vols := make([]podvol.PodVolume, n)
	paths := make([]string, n)
	for i := range specs {
		name := fmt.Sprintf("pv-%d", i)
		specs[i] = spec("drv", name, name)
		ref := podvol.PodRef{UID: types.UID(fmt.Sprintf("uid-%d", i)), Namespace: "ns", Name: fmt.Sprintf("pod-%d", i)}
		vols[i] = podvol.PodVolume{Pod: ref, SpecName: "data"}
		paths[i] = "/pods/" + string(ref.UID) + "/volumes/kubernetes.io~csi/" + name + "/mount"
	}
	a := NewActualStateOfWorld()
	before := liveBytes()
	for i := range specs {
		// What a mount does: attach, stage, and publish with the pod busy.
		a.MarkAttached(specs[i], nil)
		a.SetDeviceState(specs[i], podvol.Mounted, "/stage/"+specs[i].PVName)
		a.SetPodBusy(specs[i], vols[i], true)
		a.SetPodMount(specs[i], vols[i], podvol.Mounted, paths[i])
	}
	after := liveBytes()
	runtime.KeepAlive(a)
	perVolume := float64(after-before) / n
	t.Logf("actual state: %.0f bytes per mounted volume with one pod", perVolume)
	const limit = 650
	if perVolume > limit {
		t.Errorf("actual state keeps %.0f bytes per mounted volume with one pod, want at most %d", perVolume, limit)
	}
}
