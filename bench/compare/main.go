// Command compare runs nodevol's workload benchmarks (volumemanager), the
// same workloads on the kubelet's volume manager (bench/kubelet, a separate
// module requiring k8s.io/kubernetes) and the driver-only floor, in one
// invocation, and prints one table with the ratios nodevol/kubelet and
// nodevol/driver-only. Run it from the repository root (make bench-compare).
//
//	compare [-pods 10,100,1000,5000,10000] [-w6-pods 100,1000,5000] [-bench regexp] [-runs 3] [-syscalls] [-syscall-pods 100,300]
//
// Each figure is given as its range over the runs, and each ratio as the
// range of the ratios of the runs paired in order (nodevol's first run with
// the kubelet's first, ...).
//
// When strace is in PATH (-syscalls=false skips it), W1 (MountPods), W6
// (RealPods) and the floor (DriverOnly) also get their file-system system
// calls per pod, mount and unmount, each side's test binary run once under
// strace at each of two pod counts (-syscall-pods, 100 and 300): rows named
// MountPods/pods=100..300 and so on, the test's removal of what the run
// left and the calls one by one below the total, and under the table each
// side's own, less that removal and the floor's driver share (syscalls.go
// says what counts and why). These rows alone, a few minutes and no timed
// run, which need no quiet machine:
//
//	go run ./bench/compare -only-syscalls [-bench 'MountPods|RealPods|DriverOnly'] [-syscall-pods 100,300]
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
)

// results maps a benchmark name (without the -GOMAXPROCS suffix) to its
// metrics by unit.
type results map[string]map[string]float64

var (
	line = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+(.+)$`)
	// A benchmark's name alone (what it logged came before its results),
	// and its results on a line of their own.
	nameOnly = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s`)
	resOnly  = regexp.MustCompile(`^\s*\d+\s+(\S+ \S+.*)$`)
)

// parse reads `go test -bench` output. go test prints a benchmark's name
// before running it and its results after; whatever the benchmark logged
// meanwhile (the kubelet's klog lines) goes between them.
func parse(out []byte) results {
	r := results{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	pending := ""
	for sc.Scan() {
		m := line.FindStringSubmatch(sc.Text())
		if m == nil {
			if n := nameOnly.FindStringSubmatch(sc.Text()); n != nil {
				pending = n[1]
				continue
			}
			if res := resOnly.FindStringSubmatch(sc.Text()); res != nil && pending != "" {
				m = []string{"", pending, res[1]}
			} else {
				continue
			}
		}
		pending = ""
		f := strings.Fields(m[2])
		metrics := map[string]float64{}
		for i := 0; i+1 < len(f); i += 2 {
			if v, err := strconv.ParseFloat(f[i], 64); err == nil {
				metrics[f[i+1]] = v
			}
		}
		r[m[1]] = metrics
	}
	return r
}

// addTotals adds to each benchmark's metrics "cpu-s", the CPU the whole
// process used to mount and unmount (the whole-process CPU), where
// it measured both.
func addTotals(r results) {
	for _, m := range r {
		mount, ok1 := m["mount-cpu-s"]
		unmount, ok2 := m["unmount-cpu-s"]
		if ok1 && ok2 {
			m["cpu-s"] = mount + unmount
		}
	}
}

// bench runs the benchmarks matching re in dir/pkg and returns them, with
// pods pods (w6Pods for W6, BenchmarkRealPods).
func bench(dir, pkg, re, pods, w6Pods string) (results, error) {
	cmd := exec.Command("go", "test", "-run", "^$", "-bench", re, "-benchtime", "1x", "-timeout", "90m", pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "NODEVOL_BENCH_PODS="+pods, "NODEVOL_BENCH_W6_PODS="+w6Pods)
	fmt.Fprintf(os.Stderr, "running %s in %s ...\n", strings.Join(cmd.Args, " "), dir)
	out, err := output(cmd, os.Stderr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", strings.Join(cmd.Args, " "), err)
	}
	r := parse(out)
	addTotals(r)
	return r, nil
}

// output runs cmd and returns its standard output, which it also copies to
// log as it comes, with its standard error: the table is printed only
// once every run is done, so a run that fails (the kubelet's benchmark
// timing out on a busy machine) must not take the runs before it with it.
// Their results are in the log, in go test's format (benchstat reads it).
func output(cmd *exec.Cmd, log io.Writer) ([]byte, error) {
	var out bytes.Buffer
	l := &lockedWriter{w: log}
	cmd.Stdout = io.MultiWriter(&out, l)
	cmd.Stderr = l
	err := cmd.Run()
	return out.Bytes(), err
}

// lockedWriter serializes the writes of a command's two output streams,
// which exec copies to it from two goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// rows are the metrics the table shows, in order.
var rows = []struct{ unit, label string }{
	{"mount-s", "mount wall s"},
	{"mount-cpu-s", "mount CPU s"},
	{"unmount-s", "unmount wall s (until unstaged)"},
	{"unmount-cpu-s", "unmount CPU s"},
	{"cpu-s", "whole-process CPU s (mount + unmount)"},
	{"idle-cpu-s", "idle minute CPU s"},
	{"reconstruct-s", "restart: volumes held s"},
	{"restart-s", "restart: every pod mounted again s"},
	{"restart-cpu-s", "restart CPU s"},
	{"dials/vol", "gRPC dials per volume (mount)"},
	{"rpcs/vol", "CSI RPCs per volume (mount)"},
	{"api/vol", "API requests per volume (mount)"},
	{"api/pod", "API requests per pod (mount; lists and watches too)"},
	{"allocs/pod", "allocations per pod (mount)"},
	{"peak-heap-MiB", "peak heap MiB"},
	{"heap-inuse-harness-MiB", "heap in use, the harness alone (before the volume manager) MiB"},
	{"heap-inuse-start-MiB", "heap in use before the first pod MiB"},
	{"heap-inuse-MiB", "heap in use after mount MiB"},
	{"peak-rss-MiB", "peak RSS MiB"},
}

// apiKindRows are the rows of W6's requests by kind, its api-{verb}-{resource}/pod
// metrics on either side, in order.
func apiKindRows(a, b map[string]float64) []struct{ unit, label string } {
	kinds := map[string]bool{}
	for _, m := range []map[string]float64{a, b} {
		for unit := range m {
			if strings.HasPrefix(unit, "api-") && strings.HasSuffix(unit, "/pod") {
				kinds[unit] = true
			}
		}
	}
	var out []struct{ unit, label string }
	for _, unit := range slices.Sorted(maps.Keys(kinds)) {
		kind := strings.Replace(strings.TrimSuffix(strings.TrimPrefix(unit, "api-"), "/pod"), "-", " ", 1)
		out = append(out, struct{ unit, label string }{unit, "  of which " + kind + " per pod"})
	}
	return out
}

// kubeletTwins names, for a benchmark of nodevol's alone (a mode the
// kubelet does not have), the kubelet's benchmark of the same workload that
// its rows are set beside: BenchmarkMountPodsClusterInformers/pods=N
// (informers) beside the kubelet's BenchmarkMountPods/pods=N.
var kubeletTwins = map[string]string{"MountPodsClusterInformers": "MountPods"}

// twin returns the kubelet's results for nodevol's benchmarks named in
// kubeletTwins, under nodevol's names, from kl (the kubelet's results by
// its names).
func twin(name string, kl results) results {
	of, ok := kubeletTwins[name]
	if !ok {
		return nil
	}
	out := results{}
	for n, m := range kl {
		if rest, ok := strings.CutPrefix(n, "Benchmark"+of+"/"); ok {
			out["Benchmark"+name+"/"+rest] = m
		}
	}
	return out
}

// span prints the values of one cell over the runs: the one value when
// every run gave the same (to 4 significant digits), else "min-max"; "-"
// when no run gave one.
func span(vs []float64) string {
	if len(vs) == 0 {
		return "-"
	}
	lo, hi := slices.Min(vs), slices.Max(vs)
	a, b := strconv.FormatFloat(lo, 'g', 4, 64), strconv.FormatFloat(hi, 'g', 4, 64)
	if a == b {
		return a
	}
	return a + "-" + b
}

// ratios are a/b for each run that measured both; a run where both are 0
// counts as 1 (no difference), one where only b is 0 is left out.
func ratios(a, b []float64, aok, bok []bool) []float64 {
	var out []float64
	for i := range a {
		if !aok[i] || !bok[i] {
			continue
		}
		switch {
		case b[i] != 0:
			out = append(out, a[i]/b[i])
		case a[i] == 0:
			out = append(out, 1)
		}
	}
	return out
}

// runValues returns the value of name's unit in each run, and which runs
// measured it.
func runValues(runs []results, name, unit string) ([]float64, []bool) {
	vs, ok := make([]float64, len(runs)), make([]bool, len(runs))
	for i, r := range runs {
		vs[i], ok[i] = r[name][unit]
	}
	return vs, ok
}

// union is name's metrics of every run in one map (a later run's value
// over an earlier's): which units any run measured.
func union(runs []results, name string) map[string]float64 {
	u := map[string]float64{}
	for _, r := range runs {
		maps.Copy(u, r[name])
	}
	return u
}

// present keeps the values of the runs that measured them.
func present(vs []float64, ok []bool) []float64 {
	var out []float64
	for i, v := range vs {
		if ok[i] {
			out = append(out, v)
		}
	}
	return out
}

// benchTmp makes a directory under dir for the benchmarks, or returns ""
// when dir is empty or unusable.
func benchTmp(dir string) string {
	if dir == "" {
		return ""
	}
	d, err := os.MkdirTemp(dir, "nodevol-bench-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "not using %s: %v\n", dir, err)
		return ""
	}
	return d
}

func main() {
	pods := flag.String("pods", "10,100,1000,5000,10000", "pod counts for W1/W2, W5 and the floor")
	idle := flag.Int("idle-volumes", 10000, "volumes for W3 (the idle minute)")
	tmp := flag.String("tmpdir", "/dev/shm", "directory (a tmpfs) for the benchmarks' files; empty: TMPDIR as it is")
	w6 := flag.String("w6-pods", "100,1000,5000", "pod counts for W6 (real pods: BenchmarkRealPods)")
	re := flag.String("bench", "MountPods|MountPodsClusterInformers|Idle|SharedVolume|AttachRequired|DriverOnly|Reconstruct|RealPods",
		"benchmarks to run, names separated by |")
	runs := flag.Int("runs", 3, "runs of each benchmark on each side; the table gives each figure's range over them and the range of the ratios of the runs paired in order")
	_, straceErr := exec.LookPath("strace")
	syscalls := flag.Bool("syscalls", straceErr == nil, "count the file-system system calls per pod of W1, W6 and the floor under strace (default: when strace is in PATH)")
	onlySyscalls := flag.Bool("only-syscalls", false, "count the system calls only (implies -syscalls): no timed runs")
	syscallPods := flag.String("syscall-pods", "100,300", "the two pod counts the system calls per pod are counted between")
	flag.Parse()
	if *runs < 1 {
		fmt.Fprintln(os.Stderr, "-runs must be at least 1")
		os.Exit(2)
	}
	lo, hi, err := parsePodPair(*syscallPods)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}

	os.Setenv("NODEVOL_BENCH_IDLE_VOLUMES", strconv.Itoa(*idle))
	if dir := benchTmp(*tmp); dir != "" {
		// Both sides make the kubelet's directories and vol_data.json files; on
		// a slow disk (290 µs per mkdir on the machine of docs/PERFORMANCE.md)
		// that would hide the software being compared.
		os.Setenv("TMPDIR", dir)
		fmt.Fprintf(os.Stderr, "benchmark directories in %s\n", dir)
	}
	names := strings.Split(*re, "|")
	nv, kl := []results{{}}, []results{{}}
	if !*onlySyscalls {
		if nv, kl, err = runAll(names, *runs, *pods, *w6); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	counted := true
	if *syscalls || *onlySyscalls {
		// Once, after the timed runs, which strace would slow: nodevol's
		// counts are the same from run to run (syscalls.go says whose are
		// not).
		snv, skl, err := countSyscalls(names, lo, hi)
		if err != nil {
			// The timed runs' table is still worth printing.
			fmt.Fprintln(os.Stderr, "system calls not counted:", err)
			counted = false
		}
		maps.Copy(nv[0], snv)
		maps.Copy(kl[0], skl)
	}
	table(os.Stdout, nv, kl)
	if !counted {
		os.Exit(1)
	}
}

// runAll runs each benchmark named runs times on both sides and returns
// nodevol's results and the kubelet's, run by run. One process per
// benchmark, side and run: what one leaves on the heap must not count
// against the next. A benchmark's runs alternate between the sides, so that
// a change in the machine's load falls on both.
func runAll(names []string, runs int, pods, w6 string) (nv, kl []results, err error) {
	nv, kl = make([]results, runs), make([]results, runs)
	for i := range runs {
		nv[i], kl[i] = results{}, results{}
	}
	ran := map[string]bool{} // the kubelet's benchmarks run
	for _, name := range names {
		of := name
		if t, ok := kubeletTwins[name]; ok {
			of = t
		}
		for i := range runs {
			r, err := bench(".", "./volumemanager", "^Benchmark"+name+"$", pods, w6)
			if err != nil {
				return nil, nil, err
			}
			maps.Copy(nv[i], r)
			if name == "DriverOnly" || name == "Reconstruct" {
				continue // nodevol's floor, nodevol's restart: the kubelet's side has neither
			}
			if !ran[of] {
				if r, err = bench("bench/kubelet", ".", "^Benchmark"+of+"$", pods, w6); err != nil {
					return nil, nil, err
				}
				maps.Copy(kl[i], r)
			}
			maps.Copy(kl[i], twin(name, kl[i]))
		}
		ran[of] = true
	}
	return nv, kl, nil
}

// table prints one row per benchmark and metric: nodevol's and the
// kubelet's figures over the runs, the ratios of the paired runs, and for
// W1/W2 the driver-only floor of the same size with nodevol's ratio to it.
func table(out io.Writer, nv, kl []results) {
	names := map[string]bool{}
	for _, r := range nv {
		for n := range r {
			if !strings.HasPrefix(n, "BenchmarkDriverOnly") {
				names[n] = true
			}
		}
	}
	for _, r := range kl {
		for n := range r {
			names[n] = true
		}
	}

	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "workload\tmetric\tnodevol\tkubelet\tnodevol/kubelet\tdriver-only\tnodevol/driver-only\t")
	for _, name := range slices.Sorted(maps.Keys(names)) {
		floorName := floorOf(name)
		units := union(append(slices.Clone(nv), kl...), name)
		short := strings.TrimPrefix(name, "Benchmark")
		for _, r := range slices.Concat(rows, apiKindRows(union(nv, name), union(kl, name)), syscallRows(union(nv, name), union(kl, name))) {
			if _, ok := units[r.unit]; !ok {
				continue
			}
			a, aok := runValues(nv, name, r.unit)
			b, bok := runValues(kl, name, r.unit)
			f, fok := runValues(nv, floorName, r.unit)
			cols := []string{short, r.label, span(present(a, aok)), span(present(b, bok)),
				span(ratios(a, b, aok, bok)), span(present(f, fok)), span(ratios(a, f, aok, fok))}
			fmt.Fprintln(w, strings.Join(cols, "\t")+"\t")
		}
	}
	w.Flush()
	syscallNote(out, nv, kl)
}

// floorOf names the driver-only floor's benchmark set beside name: the
// floor of the same size beside W1, and beside W1's and W6's system calls
// per pod the floor's, counted between the same pod counts (W6's pods have
// one CSI volume each, as W1's). "" when none.
func floorOf(name string) string {
	for _, of := range []string{"MountPods/pods=", "RealPods/pods="} {
		rest, ok := strings.CutPrefix(name, "Benchmark"+of)
		if ok && (of == "MountPods/pods=" || strings.Contains(rest, "..")) {
			return "BenchmarkDriverOnly/volumes=" + rest
		}
	}
	return ""
}
