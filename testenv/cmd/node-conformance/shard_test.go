package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestParseShard(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want shard
		bad  bool
	}{
		{in: "", want: shard{}},
		{in: "1/1", want: shard{1, 1}},
		{in: "3/4", want: shard{3, 4}},
		{in: "0/4", bad: true},
		{in: "5/4", bad: true},
		{in: "1/0", bad: true},
		{in: "2", bad: true},
		{in: "a/b", bad: true},
	} {
		got, err := parseShard(tc.in)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("parseShard(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.bad)
		}
	}
}

// TestShardPlaces: every place goes to exactly one part, the parts are
// about even (they differ by no more than the largest place), and the
// same places always split the same way.
func TestShardPlaces(t *testing.T) {
	places := map[place]int{}
	for i := range 40 {
		places[place{fmt.Sprintf("f%d.go", i%7), 10 + i}] = 1 + i%5 // a place may make several specs
	}
	total, largest := 0, 0
	for _, n := range places {
		total, largest = total+n, max(largest, n)
	}
	for _, n := range []int{1, 2, 3, 4, 7} {
		seen := map[place]int{}
		var sizes []int
		for k := 1; k <= n; k++ {
			mine := shardPlaces(places, shard{k, n})
			if again := shardPlaces(places, shard{k, n}); !slices.Equal(mine, again) {
				t.Errorf("%d/%d: two splits differ", k, n)
			}
			size := 0
			for _, p := range mine {
				seen[p]++
				size += places[p]
			}
			sizes = append(sizes, size)
		}
		for p := range places {
			if seen[p] != 1 {
				t.Errorf("n=%d: place %v is in %d parts, want 1", n, p, seen[p])
			}
		}
		sum := 0
		for _, s := range sizes {
			sum += s
		}
		if sum != total || slices.Max(sizes)-slices.Min(sizes) > largest {
			t.Errorf("n=%d: part sizes %v (total %d, largest place %d)", n, sizes, total, largest)
		}
	}
}

// TestPlacesOf reads a dry run's report: the Its it would run, by place,
// not the suite's own nodes or the specs it skips.
func TestPlacesOf(t *testing.T) {
	report := `[{"SpecReports": [
	  {"LeafNodeType": "SynchronizedBeforeSuite", "State": "passed", "LeafNodeLocation": {"FileName": "suite_test.go", "LineNumber": 275}},
	  {"LeafNodeType": "It", "State": "passed", "LeafNodeLocation": {"FileName": "a.go", "LineNumber": 10}},
	  {"LeafNodeType": "It", "State": "passed", "LeafNodeLocation": {"FileName": "a.go", "LineNumber": 10}},
	  {"LeafNodeType": "It", "State": "passed", "LeafNodeLocation": {"FileName": "b.go", "LineNumber": 3}},
	  {"LeafNodeType": "It", "State": "skipped", "LeafNodeLocation": {"FileName": "c.go", "LineNumber": 5}}
	]}]`
	got, err := placesOf([]byte(report))
	if err != nil {
		t.Fatal(err)
	}
	want := map[place]int{{"a.go", 10}: 2, {"b.go", 3}: 1}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("placesOf = %v, want %v", got, want)
	}
	if _, err := placesOf([]byte(`[{"SpecReports": []}]`)); err == nil {
		t.Error("a dry run that runs nothing: no error")
	}
	if got := focusFiles([]place{{"k8s.io/kubernetes@v1.37.2/test/e2e_node/restart_test.go", 218}}); !slices.Equal(got,
		[]string{`--focus-file=^k8s\.io/kubernetes@v1\.37\.2/test/e2e_node/restart_test\.go:218`}) {
		t.Errorf("focusFiles = %q", got)
	}
}

// TestFailedPlaces: a rerun takes the places of the specs that failed in
// any of the reports (every failing state), each once, sorted; not the
// passed, skipped or suite-level ones.
func TestFailedPlaces(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.json"), filepath.Join(dir, "b.json")
	for f, report := range map[string]string{a: `[{"SpecReports": [
	  {"LeafNodeType": "SynchronizedBeforeSuite", "State": "failed", "LeafNodeLocation": {"FileName": "suite_test.go", "LineNumber": 275}},
	  {"LeafNodeType": "It", "State": "failed", "LeafNodeLocation": {"FileName": "b.go", "LineNumber": 10}},
	  {"LeafNodeType": "It", "State": "timedout", "LeafNodeLocation": {"FileName": "a.go", "LineNumber": 7}},
	  {"LeafNodeType": "It", "State": "passed", "LeafNodeLocation": {"FileName": "a.go", "LineNumber": 3}},
	  {"LeafNodeType": "It", "State": "skipped", "LeafNodeLocation": {"FileName": "c.go", "LineNumber": 5}}
	]}]`, b: `[{"SpecReports": [
	  {"LeafNodeType": "It", "State": "panicked", "LeafNodeLocation": {"FileName": "d.go", "LineNumber": 1}},
	  {"LeafNodeType": "It", "State": "interrupted", "LeafNodeLocation": {"FileName": "b.go", "LineNumber": 10}}
	]}]`} {
		if err := os.WriteFile(f, []byte(report), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got, err := failedPlaces([]string{a, b})
	if err != nil {
		t.Fatal(err)
	}
	if want := []place{{"a.go", 7}, {"b.go", 10}, {"d.go", 1}}; !slices.Equal(got, want) {
		t.Errorf("failedPlaces = %v, want %v", got, want)
	}
	if _, err := failedPlaces([]string{filepath.Join(dir, "none.json")}); err == nil {
		t.Error("a missing report: no error")
	}
}
