package volumemanager

import (
	"os"
	"path/filepath"
	"testing"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/steptest"
)

// TestCleanDroppedSubPaths: at start, the subPath targets of a pod volume
// no plugin found on disk are removed when nothing is mounted below them
// (a reboot unmounted them), with the pod's volume-subpaths directory
// (also when a cut-short clean left it empty); one with a mounted target
// (a hostPath's of a running pod, which leaves nothing to reconstruct)
// stays as it is.
func TestCleanDroppedSubPaths(t *testing.T) {
	n := newCrashNode(t, csitest.New(t, csitest.Options{}), fake.NewClientset())
	target := func(pod, vol string) string {
		return filepath.Join(n.root, "pods", pod, "volume-subpaths", vol, "app", "0")
	}
	for _, p := range []string{target("gone", "pv-1"), target("running", "host")} {
		if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o640); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(n.root, "pods", "emptied", "volume-subpaths"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := n.mounter.Mount("/host/etc", target("running", "host"), "", []string{"bind"}); err != nil {
		t.Fatal(err)
	}

	_, stop := n.start(steptest.New(nil))
	defer stop()

	for _, tc := range []struct {
		path string
		want bool
	}{
		{filepath.Join(n.root, "pods", "gone", "volume-subpaths"), false},
		{filepath.Join(n.root, "pods", "emptied", "volume-subpaths"), false},
		{target("running", "host"), true},
	} {
		_, err := os.Lstat(tc.path)
		if got := err == nil; got != tc.want {
			t.Errorf("%s exists: %v, want %v (%v)", n.rel(tc.path), got, tc.want, err)
		}
	}
	if mps, _ := n.mounter.List(); len(mps) != 1 {
		t.Errorf("mounts: %v, want the running pod's subPath mount only", mps)
	}
}
