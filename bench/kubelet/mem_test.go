package kubeletbench

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
)

// The memory figures of the workload benchmarks, measured as on nodevol's
// side (volumemanager/benchmem_test.go; this is a separate module).

// resetPeakRSS returns the memory freed by earlier runs to the kernel and
// resets the process's peak RSS (VmHWM) to its current RSS, so that the peak
// read at the end of a run is that run's, not an earlier, larger one's.
func resetPeakRSS() error {
	debug.FreeOSMemory()
	// "5" resets the peak resident set size (proc(5), clear_refs).
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		return fmt.Errorf("resetting VmHWM: %w", err)
	}
	return nil
}

// peakRSS returns the process's peak resident set size (VmHWM of
// /proc/self/status) in bytes.
func peakRSS() (uint64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("VmHWM %q: %w", rest, err)
		}
		return kb << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no VmHWM in /proc/self/status")
}

// heapInuseNow collects garbage and returns HeapInuse (heapInuseAfterGC
// without a profile).
func heapInuseNow() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// heapInuseAfterGC collects garbage and returns HeapInuse: the bytes in heap
// spans holding at least one live object (the live objects and the unused
// room of their spans), what the heap keeps while nothing is being freed.
// When NODEVOL_BENCH_HEAPPROFILE names a file, a heap profile taken at that
// moment is written to it (name.<tag>), for `go tool pprof -sample_index
// inuse_space`.
func heapInuseAfterGC(b *testing.B, tag string) uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if path := os.Getenv("NODEVOL_BENCH_HEAPPROFILE"); path != "" {
		f, err := os.Create(path + "." + tag)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
			b.Fatal(err)
		}
	}
	return ms.HeapInuse
}
