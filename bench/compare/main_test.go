package main

import (
	"maps"
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
