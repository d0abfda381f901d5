package main

// File-system system calls per pod (issue 41, items 1 and 6): each
// benchmark's test binary (go test -c; never go test itself, whose
// compiler would count) runs under strace once at a low and once at a high
// pod count, and a call's figure per pod is (calls at high - calls at low) /
// (high - low), so that what a process does once (starting, the harness,
// the informers' lists) cancels out.
//
// What counts: every call strace's classes %file (calls taking a path) and
// %desc (calls taking a descriptor) hold, traced with -y so that each
// descriptor is printed with what it refers to, less the calls on a
// descriptor that is no file: a socket, a pipe or an anonymous inode (an
// epoll instance, an eventfd, a pidfd). So a read or a write of a file
// counts and one of the CSI connection does not: on the kubelet's side,
// which dials the driver for each call, the connections' reads, writes and
// closes are about 250 calls a pod, three times its file work, that
// strace -c (which cannot tell a socket from a file) would add to it. An
// epoll_ctl is judged by the descriptor it adds (Go's os.File offers each
// file it opens to the poller, which refuses a regular file: part of
// opening a file that way), an mmap by the file it maps (one of no file is
// the Go runtime's heap). The tracee's stdout and stderr are pipes, so what
// it logs does not count either.
//
// The harness is included, on both sides, and shown apart where it can be:
// the test's removal of the directory the run's pods lived in (what a run
// leaves, the pod directories the kubelet's pod clean-up, not its volume
// manager, removes on a node) is everything from os.RemoveAll's first call
// on that directory on (removalSplit), a row of its own. The test driver's
// making and removing the publish target (CreateTargetDirs; the kubelet's
// side's driver does the same) falls within the run: the driver-only floor
// (BenchmarkDriverOnly: the same driver's stage and publish, unpublish and
// unstage, one volume a pod) less its own removal is that share. The note
// under the table gives each side's own: its figure less its removal, less
// the floor's driver share.
//
// One run at each count is enough: nodevol's counts and the floor's, and
// the kubelet's W1, are the same from run to run up to a fraction of a
// call a pod. The kubelet's W6 is not: it sets its configMap, secret and
// projected volumes up again while a run lasts, so its figure grows with
// the run's length (415 to 589 a pod over six runs on a machine loaded 12
// to 75).

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// syscallUnit is the total's unit in results, removalUnit that of the
// test's removal of what the run left; syscallUnitPrefix and "/pod" frame
// each call's.
const (
	syscallUnit       = "fs-syscalls/pod"
	removalUnit       = "fs-syscalls-removal/pod"
	syscallUnitPrefix = "sys-"
)

// syscallCounts is how many times each system call was made on a file.
type syscallCounts map[string]int

// pidPrefix is what strace -f may print before a call: its thread's pid.
const pidPrefix = `^(?:\[?(?:pid\s+)?\d+\]?\s+)?`

var (
	// A call's line: an optional pid, the call's name and its arguments.
	straceCall = regexp.MustCompile(pidPrefix + `([a-z_][a-z0-9_]*)\((.*)$`)
	// A descriptor decoded by -y: its number and what it refers to.
	decodedFD = regexp.MustCompile(`\b\d+<([^>]*)>`)
)

// notFile are the prefixes -y gives a descriptor that is no file.
var notFile = []string{"socket:", "pipe:", "anon_inode:", "UNIX", "TCP", "UDP", "NETLINK"}

// fileCall returns the name of the call on line (a line of strace -f -y
// output) and whether it counts: false for a line that starts no call (a
// call's resumption, a signal, an exit) and for a call on a descriptor
// that is no file.
func fileCall(line string) (string, bool) {
	m := straceCall.FindStringSubmatch(line)
	if m == nil || m[1] == "restart_syscall" {
		return "", false
	}
	name, args := m[1], m[2]
	fds := decodedFD.FindAllStringSubmatch(args, 3)
	which := 0 // the call's first descriptor is what it works on
	if name == "epoll_ctl" {
		which = 1 // epoll_ctl(epfd, op, fd, ...): the descriptor it adds or removes
	}
	if which >= len(fds) {
		// A call on no descriptor: one on a path counts, and an mmap of
		// no file (the Go runtime's heap: fd -1) does not.
		return name, name != "mmap" && name != "mmap2"
	}
	for _, p := range notFile {
		if strings.HasPrefix(fds[which][1], p) {
			return name, false
		}
	}
	return name, true
}

// trace is a benchmark run's calls on files: run until the test removes
// the directory the run's pods lived in, removal from then on.
type trace struct{ run, removal syscallCounts }

// removalSplit finds where, in a trace, the test starts removing what a run
// left: os.RemoveAll's first call on a directory right under tmp (TMPDIR)
// below which a "pods" directory was seen (the testing package's b.TempDir
// on nodevol's side, bench/kubelet's root on the kubelet's; a removal of
// another directory under tmp, as mount-utils' probe at start, is no
// split).
type removalSplit struct {
	under   *regexp.Regexp // a path under tmp/X/.../pods/: X
	remove  *regexp.Regexp // os.RemoveAll's first call on tmp/X: X
	roots   map[string]bool
	removed bool
}

// newRemovalSplit returns the split of a trace whose TMPDIR was tmp.
func newRemovalSplit(tmp string) *removalSplit {
	q := regexp.QuoteMeta(strings.TrimSuffix(tmp, "/"))
	return &removalSplit{
		under:  regexp.MustCompile(q + `/([^/"<>]+)/(?:[^"<>]*/)?pods/`),
		remove: regexp.MustCompile(pidPrefix + `unlinkat\(AT_FDCWD(?:<[^>]*>)?, "` + q + `/([^/"]+)", 0(?:\)| <unfinished)`),
		roots:  map[string]bool{},
	}
}

// inRemoval reports whether line is part of the removal: at or after the
// split.
func (s *removalSplit) inRemoval(line string) bool {
	if s.removed {
		return true
	}
	if m := s.remove.FindStringSubmatch(line); m != nil && s.roots[m[1]] {
		s.removed = true
		return true
	}
	if m := s.under.FindStringSubmatch(line); m != nil {
		s.roots[m[1]] = true
	}
	return false
}

// parseStrace counts the calls on files in strace -f -y output (see
// fileCall) of a benchmark whose TMPDIR was tmp, those of the test's
// removal of what the run left apart (removalSplit). A call interrupted by
// another thread's is printed twice, its start ("<unfinished ...>") and its
// end ("<... name resumed>"); it counts once, at its start.
func parseStrace(r io.Reader, tmp string) (trace, error) {
	t := trace{run: syscallCounts{}, removal: syscallCounts{}}
	split := newRemovalSplit(tmp)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		in := split.inRemoval(sc.Text())
		if name, ok := fileCall(sc.Text()); ok {
			if in {
				t.removal[name]++
			} else {
				t.run[name]++
			}
		}
	}
	if err := sc.Err(); err != nil {
		return trace{}, fmt.Errorf("reading strace output: %w", err)
	}
	return t, nil
}

// all is every call of t, the removal's too.
func (t trace) all() syscallCounts {
	c := maps.Clone(t.run)
	for n, v := range t.removal {
		c[n] += v
	}
	return c
}

// perPod returns each call's count per pod between a run of lo pods and
// one of hi, (hi's - lo's) / (hi - lo), for every call either run made (0
// for one made as often in both: a row shows 0, not "not measured", on a
// side that counted), and their sum under syscallUnit.
func perPod(low, high syscallCounts, lo, hi int) (map[string]float64, error) {
	if hi <= lo {
		return nil, fmt.Errorf("pod counts %d and %d: the second must be larger", lo, hi)
	}
	names := map[string]bool{}
	for n := range low {
		names[n] = true
	}
	for n := range high {
		names[n] = true
	}
	out := map[string]float64{}
	total := 0
	for name := range names {
		d := high[name] - low[name]
		total += d
		out[syscallUnitPrefix+name+"/pod"] = float64(d) / float64(hi-lo)
	}
	out[syscallUnit] = float64(total) / float64(hi-lo)
	return out, nil
}

// tracePerPod is perPod of every call of the two runs, with the removal's
// total per pod under removalUnit.
func tracePerPod(low, high trace, lo, hi int) (map[string]float64, error) {
	out, err := perPod(low.all(), high.all(), lo, hi)
	if err != nil {
		return nil, err
	}
	removal, err := perPod(low.removal, high.removal, lo, hi)
	if err != nil {
		return nil, err
	}
	out[removalUnit] = removal[syscallUnit]
	return out, nil
}

// parsePodPair reads -syscall-pods: two pod counts, the lower first.
func parsePodPair(s string) (lo, hi int, err error) {
	f := strings.Split(s, ",")
	if len(f) != 2 {
		return 0, 0, fmt.Errorf("-syscall-pods %q: want two pod counts, as 100,300", s)
	}
	if lo, err = strconv.Atoi(strings.TrimSpace(f[0])); err == nil {
		hi, err = strconv.Atoi(strings.TrimSpace(f[1]))
	}
	if err != nil {
		return 0, 0, fmt.Errorf("-syscall-pods %q: %w", s, err)
	}
	if lo < 1 || hi <= lo {
		return 0, 0, fmt.Errorf("-syscall-pods %q: want 0 < low < high", s)
	}
	return lo, hi, nil
}

// syscallBenchmarks are the benchmarks whose calls are counted, and the
// environment variable giving each its pod count.
var syscallBenchmarks = map[string]string{
	"MountPods":  "NODEVOL_BENCH_PODS",
	"RealPods":   "NODEVOL_BENCH_W6_PODS",
	"DriverOnly": "NODEVOL_BENCH_PODS",
}

// syscallName is the table's name of a benchmark's figures per pod between
// lo and hi pods (volumes for the floor, as its other rows).
func syscallName(bench string, lo, hi int) string {
	per := "pods"
	if bench == "DriverOnly" {
		per = "volumes"
	}
	return fmt.Sprintf("Benchmark%s/%s=%d..%d", bench, per, lo, hi)
}

// side is one side's test binary: the package it is built from and the
// directory it runs in (as go test runs it).
type side struct {
	dir, pkg string
	bin      string // built by build
}

// build compiles s's test binary into dir.
func (s *side) build(dir, name string) error {
	s.bin = filepath.Join(dir, name+".test")
	cmd := exec.Command("go", "test", "-c", "-o", s.bin, s.pkg)
	cmd.Dir, cmd.Stdout, cmd.Stderr = s.dir, os.Stderr, os.Stderr
	fmt.Fprintf(os.Stderr, "building %s in %s ...\n", s.pkg, s.dir)
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go test -c %s: %w", s.pkg, err)
	}
	return nil
}

// straceRun runs benchmark bench of s with pods pods under strace and
// returns its calls on files. The trace goes to a file in tmp, removed
// after.
func (s *side) straceRun(tmp, bench string, pods int) (trace, error) {
	f, err := os.CreateTemp(tmp, "strace-*.log")
	if err != nil {
		return trace{}, fmt.Errorf("strace output: %w", err)
	}
	f.Close()
	defer os.Remove(f.Name())
	bin, err := filepath.Abs(s.bin)
	if err != nil {
		return trace{}, fmt.Errorf("test binary: %w", err)
	}
	cmd := exec.Command("strace", "-f", "-qq", "-y", "-e", "trace=%file,%desc", "-e", "signal=none", "-o", f.Name(),
		bin, "-test.run", "^$", "-test.bench", "^Benchmark"+bench+"$", "-test.benchtime", "1x", "-test.timeout", "90m")
	cmd.Dir = s.dir
	cmd.Env = append(os.Environ(), syscallBenchmarks[bench]+"="+strconv.Itoa(pods))
	// Pipes, whose writes do not count (fileCall), and kept for an error.
	var out tail
	cmd.Stdout, cmd.Stderr = &out, &out
	fmt.Fprintf(os.Stderr, "counting system calls: %s, %d pods, in %s ...\n", bench, pods, s.dir)
	if err := cmd.Run(); err != nil {
		return trace{}, fmt.Errorf("strace of %s at %d pods: %w\n%s", bench, pods, err, out.b)
	}
	r, err := os.Open(f.Name())
	if err != nil {
		return trace{}, fmt.Errorf("strace output: %w", err)
	}
	defer r.Close()
	return parseStrace(r, os.TempDir())
}

// tail keeps the last 64 KiB written to it.
type tail struct{ b []byte }

func (t *tail) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if over := len(t.b) - 64<<10; over > 0 {
		t.b = t.b[over:]
	}
	return len(p), nil
}

// countSyscalls counts, for each benchmark named that has a figure here
// (syscallBenchmarks), the file-system calls per pod on each side that has
// it, and returns nodevol's and the kubelet's, under syscallName.
func countSyscalls(names []string, lo, hi int) (nv, kl results, err error) {
	var want []string
	kubelet := false
	for _, n := range names {
		if _, ok := syscallBenchmarks[n]; ok && !slices.Contains(want, n) {
			want = append(want, n)
			kubelet = kubelet || n != "DriverOnly"
		}
	}
	nv, kl = results{}, results{}
	if len(want) == 0 {
		return nv, kl, nil
	}
	if _, err := exec.LookPath("strace"); err != nil {
		return nil, nil, fmt.Errorf("counting system calls: %w", err) // before minutes of building
	}
	tmp, err := os.MkdirTemp("", "nodevol-syscalls-")
	if err != nil {
		return nil, nil, fmt.Errorf("directory for the test binaries: %w", err)
	}
	defer os.RemoveAll(tmp)
	type counted struct {
		s   *side
		out results
	}
	sides := []counted{{&side{dir: ".", pkg: "./volumemanager"}, nv}}
	if kubelet {
		sides = append(sides, counted{&side{dir: "bench/kubelet", pkg: "."}, kl})
	}
	for i, sd := range sides {
		if err := sd.s.build(tmp, strconv.Itoa(i)); err != nil {
			return nil, nil, err
		}
		for _, bench := range want {
			if i > 0 && bench == "DriverOnly" {
				continue // nodevol's floor: the kubelet's side has none
			}
			if sd.out[syscallName(bench, lo, hi)], err = sd.s.perPodRuns(tmp, bench, lo, hi); err != nil {
				return nil, nil, err
			}
		}
	}
	for _, bench := range want {
		name := syscallName(bench, lo, hi)
		zeroMissing(nv[name], kl[name], nv[floorOf(name)])
	}
	return nv, kl, nil
}

// zeroMissing gives each of sets (one benchmark's calls per pod on each
// side that counted them; nil for one that did not) a 0 for each call
// another made and it never did: the table then says 0, not "-", which
// means not counted.
func zeroMissing(sets ...map[string]float64) {
	for _, a := range sets {
		for _, b := range sets {
			for unit := range a {
				if _, ok := b[unit]; !ok && b != nil {
					b[unit] = 0
				}
			}
		}
	}
}

// perPodRuns runs bench at lo and at hi pods and returns its calls per pod.
func (s *side) perPodRuns(tmp, bench string, lo, hi int) (map[string]float64, error) {
	low, err := s.straceRun(tmp, bench, lo)
	if err != nil {
		return nil, err
	}
	high, err := s.straceRun(tmp, bench, hi)
	if err != nil {
		return nil, err
	}
	if len(low.run) == 0 || len(high.run) == 0 {
		return nil, errors.New("strace saw no calls on files: is -y supported?")
	}
	return tracePerPod(low, high, lo, hi)
}

// minCallsPerPod is the least a call must be made per pod, on either side,
// to get a row of its own: below it is a count's noise (a goroutine
// started or not, a retried call).
const minCallsPerPod = 0.05

// syscallRows are the rows of the file-system calls per pod, when either
// side (a, b: its metrics) counted them: the total, then each call made at
// least minCallsPerPod times a pod on a side, the most made first.
func syscallRows(a, b map[string]float64) []struct{ unit, label string } {
	most := map[string]float64{}
	for _, m := range []map[string]float64{a, b} {
		for unit, v := range m {
			if strings.HasPrefix(unit, syscallUnitPrefix) && strings.HasSuffix(unit, "/pod") {
				most[unit] = max(most[unit], math.Abs(v))
			}
		}
	}
	maps.DeleteFunc(most, func(_ string, v float64) bool { return v < minCallsPerPod })
	_, ina := a[syscallUnit]
	_, inb := b[syscallUnit]
	if !ina && !inb {
		return nil
	}
	units := slices.SortedFunc(maps.Keys(most), func(x, y string) int {
		if c := cmp.Compare(most[y], most[x]); c != 0 {
			return c
		}
		return strings.Compare(x, y)
	})
	out := []struct{ unit, label string }{
		{syscallUnit, "file-system system calls per pod (mount + unmount)"},
		{removalUnit, "  of which the test's removal of what the run left"},
	}
	for _, unit := range units {
		call := strings.TrimSuffix(strings.TrimPrefix(unit, syscallUnitPrefix), "/pod")
		out = append(out, struct{ unit, label string }{unit, "  of which " + call})
	}
	return out
}

// syscallNote prints, under the table, each side's own file-system calls
// per pod: its figure less the test's removal of what the run left and
// less the driver's work, the floor's figure less its removal.
func syscallNote(out io.Writer, nv, kl []results) {
	names := map[string]bool{}
	for _, r := range slices.Concat(nv, kl) {
		for n, m := range r {
			if _, ok := m[syscallUnit]; ok && !strings.HasPrefix(n, "BenchmarkDriverOnly") {
				names[n] = true
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(names)) {
		driver, ok := own(nv, floorOf(name), 0)
		if !ok {
			continue
		}
		line := fmt.Sprintf("%s: file-system system calls per pod less the test's removal and the driver's %s:",
			strings.TrimPrefix(name, "Benchmark"), strconv.FormatFloat(driver, 'g', 4, 64))
		for _, sd := range []struct {
			label string
			runs  []results
		}{{"nodevol", nv}, {"kubelet", kl}} {
			v, ok := own(sd.runs, name, driver)
			s := "-"
			if ok {
				s = strconv.FormatFloat(v, 'g', 4, 64)
			}
			line += " " + sd.label + " " + s
		}
		fmt.Fprintln(out, line)
	}
}

// own is name's file-system calls per pod less the test's removal and
// less driver, from the first run that counted them.
func own(runs []results, name string, driver float64) (float64, bool) {
	for _, r := range runs {
		if v, ok := r[name][syscallUnit]; ok {
			return v - r[name][removalUnit] - driver, true
		}
	}
	return 0, false
}
