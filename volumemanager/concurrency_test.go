package volumemanager

import (
	"runtime"
	"testing"

	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"
)

// TestMaxConcurrentOperationsDefault: unset, the bound on operations in
// flight follows the CPUs (32 each, at least 64); set, it is kept.
func TestMaxConcurrentOperationsDefault(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, tc := range []struct {
		procs, set, want int
	}{
		{procs: 1, want: 64},
		{procs: 2, want: 64},
		{procs: 4, want: 128},
		{procs: 16, want: 512},
		{procs: 16, set: 10, want: 10},
	} {
		runtime.GOMAXPROCS(tc.procs)
		vm, err := New(Config{NodeName: node, KubeClient: fake.NewClientset(), RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil), MaxConcurrentOperations: tc.set})
		if err != nil {
			t.Fatal(err)
		}
		if got := vm.cfg.MaxConcurrentOperations; got != tc.want {
			t.Errorf("GOMAXPROCS %d, MaxConcurrentOperations %d: got %d, want %d", tc.procs, tc.set, got, tc.want)
		}
	}
}
