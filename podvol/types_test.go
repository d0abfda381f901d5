package podvol

import (
	"fmt"
	"testing"
)

func TestCSIVolumeName(t *testing.T) {
	if got := CSIVolumeName("d.example.com", "vol-1"); got != "kubernetes.io/csi/d.example.com^vol-1" {
		t.Fatalf("got %q", got)
	}
}

// TestPodRefString: a pod known only by its UID (found on disk at start)
// is named by it in messages, not as "pod /".
func TestPodRefString(t *testing.T) {
	for _, tc := range []struct {
		ref  PodRef
		want string
	}{
		{PodRef{UID: "1234", Namespace: "ns", Name: "web"}, "pod ns/web"},
		{PodRef{UID: "1234"}, "pod with UID 1234"},
	} {
		if got := fmt.Sprintf("pod %s", tc.ref); got != tc.want {
			t.Errorf("%#v: %q, want %q", tc.ref, got, tc.want)
		}
	}
}

func TestMountStateString(t *testing.T) {
	for s, want := range map[MountState]string{NotMounted: "NotMounted", Uncertain: "Uncertain", Mounted: "Mounted", 7: "MountState(7)"} {
		if s.String() != want {
			t.Errorf("%d: %q", int(s), s.String())
		}
	}
	if NotMounted.MayBeMounted() || !Uncertain.MayBeMounted() || !Mounted.MayBeMounted() {
		t.Error("MayBeMounted wrong")
	}
}
