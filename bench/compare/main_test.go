package main

import (
	"bytes"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestParse reads results printed on the benchmark's line, and results
// printed after lines the benchmark logged (the kubelet's klog lines between
// a benchmark's name and its results lost the 1,000-pod row of a run).
func TestParse(t *testing.T) {
	out := "goos: linux\n" +
		"BenchmarkMountPods/pods=10-2         \t       1\t      7934 allocs/pod\t         0.01866 mount-cpu-s\n" +
		"BenchmarkMountPods/pods=1000-2       \tE1123 20:05:11.757336    2412 nestedpendingoperations.go:348] Operation for x\n" +
		"E1123 20:05:11.757362    2412 nestedpendingoperations.go:348] Operation for y\n" +
		"       1\t      7984 allocs/pod\t         2.536 mount-cpu-s\t 1.5 unmount-cpu-s\n" +
		"PASS\n"
	got := parse([]byte(out))
	addTotals(got)
	want := results{
		"BenchmarkMountPods/pods=10":   {"allocs/pod": 7934, "mount-cpu-s": 0.01866},
		"BenchmarkMountPods/pods=1000": {"allocs/pod": 7984, "mount-cpu-s": 2.536, "unmount-cpu-s": 1.5, "cpu-s": 4.036},
	}
	if !maps.EqualFunc(got, want, func(a, b map[string]float64) bool { return maps.Equal(a, b) }) {
		t.Errorf("parse = %v, want %v", got, want)
	}
}

// TestAPIKindRows: W6's requests by kind become one row each, in order,
// whichever side reported them; other metrics make none.
func TestAPIKindRows(t *testing.T) {
	nv := map[string]float64{"api/pod": 5, "api-list-configmaps/pod": 1, "api-create-serviceaccounts.token/pod": 1, "mount-s": 1}
	kl := map[string]float64{"api-get-persistentvolumeclaims/pod": 3, "api-list-configmaps/pod": 1}
	got := apiKindRows(nv, kl)
	want := []string{
		"api-create-serviceaccounts.token/pod:  of which create serviceaccounts.token per pod",
		"api-get-persistentvolumeclaims/pod:  of which get persistentvolumeclaims per pod",
		"api-list-configmaps/pod:  of which list configmaps per pod",
	}
	if len(got) != len(want) {
		t.Fatalf("apiKindRows = %v, want %v", got, want)
	}
	for i, r := range got {
		if s := r.unit + ":" + r.label; s != want[i] {
			t.Errorf("row %d = %q, want %q", i, s, want[i])
		}
	}
}

// TestTable: each cell is the range over the runs, each ratio the range of
// the paired runs' ratios, a figure every run gave alike is printed once,
// W1's floor comes from DriverOnly of the same size, and a metric no run
// measured makes no row.
func TestTable(t *testing.T) {
	nv := []results{
		{"BenchmarkMountPods/pods=10": {"mount-s": 1, "dials/vol": 0}, "BenchmarkDriverOnly/volumes=10": {"mount-s": 0.5}},
		{"BenchmarkMountPods/pods=10": {"mount-s": 2, "dials/vol": 0}, "BenchmarkDriverOnly/volumes=10": {"mount-s": 0.5}},
		{"BenchmarkMountPods/pods=10": {"mount-s": 3, "dials/vol": 0}, "BenchmarkDriverOnly/volumes=10": {"mount-s": 1}},
	}
	kl := []results{
		{"BenchmarkMountPods/pods=10": {"mount-s": 10, "dials/vol": 8}},
		{"BenchmarkMountPods/pods=10": {"mount-s": 40, "dials/vol": 8}},
		{"BenchmarkMountPods/pods=10": {"mount-s": 10, "dials/vol": 8}},
	}
	var b strings.Builder
	table(&b, nv, kl)
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(b.String()), "\n")[1:] {
		got = append(got, strings.Join(strings.Fields(l), " "))
	}
	want := []string{
		"MountPods/pods=10 mount wall s 1-3 10-40 0.05-0.3 0.5-1 2-4",
		"MountPods/pods=10 gRPC dials per volume (mount) 0 8 0 - -",
	}
	if !slices.Equal(got, want) {
		t.Errorf("table =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestTwin: nodevol's W1 with informers gets the kubelet's W1 results, pod
// count by pod count, under its own names; other benchmarks get none.
func TestTwin(t *testing.T) {
	kl := results{
		"BenchmarkMountPods/pods=5000":  {"heap-inuse-MiB": 152},
		"BenchmarkMountPods/pods=10000": {"heap-inuse-MiB": 300},
		"BenchmarkRealPods/pods=5000":   {"heap-inuse-MiB": 485},
	}
	cases := []struct {
		name string
		want results
	}{
		{"MountPodsClusterInformers", results{
			"BenchmarkMountPodsClusterInformers/pods=5000":  {"heap-inuse-MiB": 152},
			"BenchmarkMountPodsClusterInformers/pods=10000": {"heap-inuse-MiB": 300},
		}},
		{"MountPods", nil},
		{"RealPods", nil},
	}
	for _, c := range cases {
		got := twin(c.name, kl)
		if !maps.EqualFunc(got, c.want, func(a, b map[string]float64) bool { return maps.Equal(a, b) }) {
			t.Errorf("twin(%s) = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestTableTwin: the rows with informers carry the kubelet's W1 beside
// nodevol's, the heap rows in order, with their ratios.
func TestTableTwin(t *testing.T) {
	nv := []results{{"BenchmarkMountPodsClusterInformers/pods=5000": {
		"heap-inuse-harness-MiB": 20, "heap-inuse-start-MiB": 25, "heap-inuse-MiB": 50, "api/vol": 2}}}
	kl := []results{{"BenchmarkMountPods/pods=5000": {
		"heap-inuse-harness-MiB": 20, "heap-inuse-start-MiB": 30, "heap-inuse-MiB": 100, "api/vol": 4}}}
	maps.Copy(kl[0], twin("MountPodsClusterInformers", kl[0]))
	var out strings.Builder
	table(&out, nv, kl)
	var got []string
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.Contains(l, "MountPodsClusterInformers/") {
			got = append(got, strings.Join(strings.Fields(l), " "))
		}
	}
	want := []string{
		"MountPodsClusterInformers/pods=5000 API requests per volume (mount) 2 4 0.5 - -",
		"MountPodsClusterInformers/pods=5000 heap in use, the harness alone (before the volume manager) MiB 20 20 1 - -",
		"MountPodsClusterInformers/pods=5000 heap in use before the first pod MiB 25 30 0.8333 - -",
		"MountPodsClusterInformers/pods=5000 heap in use after mount MiB 50 100 0.5 - -",
	}
	if !slices.Equal(got, want) {
		t.Errorf("rows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestOutput checks that a run's results reach the log as they come, and
// are returned, also when the run then fails: a later failure must not
// lose the runs before it.
func TestOutput(t *testing.T) {
	for _, tc := range []struct {
		name    string
		exit    string
		wantErr bool
	}{
		{"passes", "exit 0", false},
		{"fails after its results", "exit 1", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			result := "BenchmarkMountPods/pods=10-2 \t 1 \t 0.5 mount-s"
			cmd := exec.Command("sh", "-c", "echo '"+result+"'; echo 'klog line' >&2; "+tc.exit)
			var log bytes.Buffer
			out, err := output(cmd, &log)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if !strings.Contains(log.String(), result) || !strings.Contains(log.String(), "klog line") {
				t.Errorf("log = %q, want the result and the standard error", log.String())
			}
			if got := parse(out)["BenchmarkMountPods/pods=10"]["mount-s"]; got != 0.5 {
				t.Errorf("parsed mount-s = %v from %q, want 0.5", got, out)
			}
		})
	}
}
