package volumemanager

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

// The memory figures of the workload benchmarks. bench/kubelet measures its
// side with the same functions (its own copy: a separate module).

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
func peakRSS() (uint64, error) { return procStatus("VmHWM") }

// procStatus returns a size field of /proc/self/status (VmHWM, VmRSS,
// RssFile, ...) in bytes.
func procStatus(field string) (uint64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), field+":")
		if !ok {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s %q: %w", field, rest, err)
		}
		return kb << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no %s in /proc/self/status", field)
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

// phaseProfile starts a CPU profile of one phase of a workload ("mount",
// "unmount") when NODEVOL_BENCH_CPUPROFILE names a file: written to
// name.<phase>.<n>, n counting the runs, so that a profile holds the phase
// alone, without the setup and the other phase that -cpuprofile mixes in
// (merge the runs with `go tool pprof -proto name.mount.* > mount.prof`).
// It returns the function that stops the profile. Not to be combined with
// -cpuprofile: one CPU profile runs at a time.
func phaseProfile(b *testing.B, phase string) (stop func()) {
	path := os.Getenv("NODEVOL_BENCH_CPUPROFILE")
	if path == "" {
		return func() {}
	}
	phaseRuns[phase]++
	f, err := os.Create(fmt.Sprintf("%s.%s.%d", path, phase, phaseRuns[phase]))
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		b.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// phaseRuns counts phaseProfile's profiles by phase (benchmarks run one at
// a time).
var phaseRuns = map[string]int{}
