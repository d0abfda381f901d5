package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// A shard is part K of N of a suite's specs, so that a suite longer than
// a sitting (every [NodeConformance] spec: about 4 hours a side here)
// runs in parts whose reports conformance-report takes together. Specs are
// split by their place in the suite's source (the file and line of their
// It): specs made at one place (a table's entries, a loop's) always go to
// the same part, which ginkgo's --focus-file selects exactly, ANDed with
// the suite's focus and skip. Every spec the suite runs is in exactly one
// part (TestShardPlaces; checked against e2e_node.test's dry run by
// TestShardsCoverSuite when the binary is built).
type shard struct{ k, n int }

// parseShard parses "K/N" (1 <= K <= N); "" is no shard.
func parseShard(s string) (shard, error) {
	if s == "" {
		return shard{}, nil
	}
	a, b, ok := strings.Cut(s, "/")
	k, errK := strconv.Atoi(a)
	n, errN := strconv.Atoi(b)
	if !ok || errK != nil || errN != nil || n < 1 || k < 1 || k > n {
		return shard{}, fmt.Errorf("shard %q: want K/N with 1 <= K <= N", s)
	}
	return shard{k, n}, nil
}

// place is where specs are made: their It's file and line.
type place struct {
	file string
	line int
}

// specPlaces lists the places of the specs the suite would run with focus
// and skip, and how many specs each makes, from e2e_node.test's dry run
// (which starts nothing).
func specPlaces(ctx context.Context, suiteBin, focus, skip string) (map[place]int, error) {
	dir, err := os.MkdirTemp("", "nc-dry-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	report := filepath.Join(dir, "dry.json")
	args := []string{"--ginkgo.dry-run", "--ginkgo.no-color", "--ginkgo.focus=" + focus, "--ginkgo.json-report=" + report}
	if skip != "" {
		args = append(args, "--ginkgo.skip="+skip)
	}
	cmd := exec.CommandContext(ctx, suiteBin, args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("listing the suite's specs (%s --ginkgo.dry-run): %w\n%s", suiteBin, err, out)
	}
	data, err := os.ReadFile(report)
	if err != nil {
		return nil, err
	}
	return placesOf(data)
}

// placesOf reads a dry run's ginkgo JSON report: the places of the Its it
// would run.
func placesOf(data []byte) (map[place]int, error) {
	// A dry run "passes" what it would run.
	places, err := placesIn(data, func(state string) bool { return state == "passed" })
	if err == nil && len(places) == 0 {
		err = fmt.Errorf("the dry run would run no spec")
	}
	return places, err
}

// failedPlaces are the places of the Its that failed (timed out, panicked,
// were interrupted or aborted) in the ginkgo JSON reports, sorted: a rerun
// takes every spec made at such a place (a table's other entries too).
func failedPlaces(reports []string) ([]place, error) {
	all := map[place]int{}
	for _, r := range reports {
		data, err := os.ReadFile(r)
		if err != nil {
			return nil, err
		}
		places, err := placesIn(data, func(state string) bool {
			return slices.Contains([]string{"failed", "timedout", "panicked", "interrupted", "aborted"}, state)
		})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", r, err)
		}
		for p, n := range places {
			all[p] += n
		}
	}
	out := make([]place, 0, len(all))
	for p := range all {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b place) int { return cmp.Or(cmp.Compare(a.file, b.file), cmp.Compare(a.line, b.line)) })
	return out, nil
}

// placesIn reads a ginkgo JSON report: the places of the Its whose state
// keep accepts, and how many specs each made.
func placesIn(data []byte, keep func(state string) bool) (map[place]int, error) {
	var reports []struct {
		SpecReports []struct {
			LeafNodeType     string
			State            string
			LeafNodeLocation struct {
				FileName   string
				LineNumber int
			}
		}
	}
	if err := json.Unmarshal(data, &reports); err != nil {
		return nil, fmt.Errorf("a ginkgo JSON report: %w", err)
	}
	places := map[place]int{}
	for _, r := range reports {
		for _, s := range r.SpecReports {
			if s.LeafNodeType == "It" && keep(s.State) {
				places[place{s.LeafNodeLocation.FileName, s.LeafNodeLocation.LineNumber}]++
			}
		}
	}
	return places, nil
}

// shardPlaces returns the places of part sh.k: places taken in order of
// file and line, each to the part with the fewest specs so far (the first
// of those), so that the parts are about even and the same suite always
// splits the same way.
func shardPlaces(places map[place]int, sh shard) []place {
	all := make([]place, 0, len(places))
	for p := range places {
		all = append(all, p)
	}
	slices.SortFunc(all, func(a, b place) int { return cmp.Or(cmp.Compare(a.file, b.file), cmp.Compare(a.line, b.line)) })
	counts := make([]int, sh.n)
	var mine []place
	for _, p := range all {
		i := slices.Index(counts, slices.Min(counts))
		counts[i] += places[p]
		if i == sh.k-1 {
			mine = append(mine, p)
		}
	}
	return mine
}

// focusFiles are ginkgo's --focus-file flags selecting exactly the specs
// made at places.
func focusFiles(places []place) []string {
	out := make([]string, 0, len(places))
	for _, p := range places {
		// FILE_REGEX:LINE; a line matches the It there (no container of
		// another spec is on an It's line).
		out = append(out, fmt.Sprintf("--focus-file=^%s:%d", regexp.QuoteMeta(p.file), p.line))
	}
	return out
}
