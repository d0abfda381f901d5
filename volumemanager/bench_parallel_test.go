package volumemanager

import (
	"fmt"
	"testing"
)

// BenchmarkMaxConcurrentOperations is W1 and W2 at 5,000 pods (or
// NODEVOL_BENCH_PODS) with Config.MaxConcurrentOperations at 16, 64 (the
// default), 256 and 1,024: whether the bound on operations in flight limits
// the mount or the unmount (wall and CPU), on the machine it runs on. Run it
// with -cpu 1,2,... to see how each setting scales with GOMAXPROCS.
func BenchmarkMaxConcurrentOperations(b *testing.B) {
	for _, n := range benchSizes(5000) {
		for _, ops := range []int{16, 64, 256, 1024} {
			b.Run(fmt.Sprintf("pods=%d/ops=%d", n, ops), func(b *testing.B) { report(b, workload{pods: n, maxOps: ops}) })
		}
	}
}
