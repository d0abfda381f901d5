package kubeletbench

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// fleetSummary is every run saved in a directory (BenchmarkFleet).
type fleetSummary struct {
	results []*fleetResult
}

// loadFleet reads every run saved in dir.
func loadFleet(dir string) (*fleetSummary, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "nodes-*.json"))
	if err != nil {
		return nil, err
	}
	s := &fleetSummary{}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		var r fleetResult
		if err := json.Unmarshal(data, &r); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		s.results = append(s.results, &r)
	}
	return s, nil
}

// fleetShape is a run's nodes and pods per node, whether its pods had
// claims, and its runtime.
type fleetShape struct {
	nodes, pods int
	claims      bool
	runtime     string
}

// markdown is, per shape (nodes, pods per node, runtime), a table of each figure's
// range over the runs per side and the range of the fork/kubelet ratios of
// the runs done on both sides; then the requests per node by resource.
func (s *fleetSummary) markdown() string {
	var shapes []fleetShape
	for _, r := range s.results {
		if sh := (fleetShape{r.Nodes, r.Pods, r.Claims, fleetRuntimeOf(r.Runtime)}); !slices.Contains(shapes, sh) {
			shapes = append(shapes, sh)
		}
	}
	// The fake runtime's first (""), then the real ones by name.
	rt := func(sh fleetShape) string { return strings.TrimPrefix(sh.runtime, fleetFake) }
	slices.SortFunc(shapes, func(a, b fleetShape) int {
		return cmp.Or(cmp.Compare(a.nodes, b.nodes), cmp.Compare(a.pods, b.pods), compareBool(a.claims, b.claims), cmp.Compare(rt(a), rt(b)))
	})
	var sb strings.Builder
	for _, sh := range shapes {
		kubelet, fork := s.runs(sh, "kubelet"), s.runs(sh, "fork")
		on := ""
		if sh.runtime != fleetFake {
			on = ", on " + sh.runtime
		}
		fmt.Fprintf(&sb, "### %d nodes, %d pods each%s%s (runs: kubelet %d, fork %d)\n\n", sh.nodes, sh.pods, sh.claimsTitle(), on, len(kubelet), len(fork))
		sb.WriteString("| figure | kubelet | fork | fork/kubelet |\n|---|---|---|---|\n")
		for _, f := range figuresOf(sh.runtime) {
			k, fk := figureRange(kubelet, f.key), figureRange(fork, f.key)
			fmt.Fprintf(&sb, "| %s | %s | %s | %s |\n", f.what, k, fk, ratioRange(kubelet, fork, f.key))
		}
		sb.WriteString(claimRows(sh, kubelet, fork))
		sb.WriteString("\n")
		sb.WriteString(requestTable(kubelet, fork))
		sb.WriteString("\n")
	}
	return sb.String()
}

// runs are the runs of shape sh on side, by run index.
func (s *fleetSummary) runs(sh fleetShape, side string) map[int]*fleetResult {
	out := map[int]*fleetResult{}
	for _, r := range s.results {
		if r.Nodes == sh.nodes && r.Pods == sh.pods && r.Claims == sh.claims && fleetRuntimeOf(r.Runtime) == sh.runtime && r.Side == side {
			out[r.Run] = r
		}
	}
	return out
}

// figureRange is "min-max" of key over runs ("v" when they agree, "-"
// without any).
func figureRange(runs map[int]*fleetResult, key string) string {
	var vs []float64
	for _, r := range runs {
		if v, ok := r.Figures[key]; ok && !math.IsNaN(v) {
			vs = append(vs, v)
		}
	}
	return valueRange(vs)
}

// ratioRange is the range of fork/kubelet of key over the runs done on
// both sides.
func ratioRange(kubelet, fork map[int]*fleetResult, key string) string {
	var vs []float64
	for run, k := range kubelet {
		f, ok := fork[run]
		if !ok {
			continue
		}
		kv, fv := k.Figures[key], f.Figures[key]
		if kv != 0 && !math.IsNaN(kv) && !math.IsNaN(fv) {
			vs = append(vs, fv/kv)
		}
	}
	return valueRange(vs)
}

// valueRange formats the range of vs.
func valueRange(vs []float64) string {
	if len(vs) == 0 {
		return "-"
	}
	lo, hi := slices.Min(vs), slices.Max(vs)
	if fmtNum(lo) == fmtNum(hi) {
		return fmtNum(lo)
	}
	return fmtNum(lo) + "–" + fmtNum(hi)
}

// requestTable is the requests per node by "verb resource" and phase,
// each side's mean over its runs: one column per side and phase.
func requestTable(kubelet, fork map[int]*fleetResult) string {
	phases := []string{"boot", "start", "rest", "watches", "churn", "delete"}
	keys := map[string]bool{}
	for _, runs := range []map[int]*fleetResult{kubelet, fork} {
		for _, r := range runs {
			for _, ph := range phases {
				for k := range r.Requests[ph] {
					keys[k] = true
				}
			}
		}
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	slices.Sort(sorted)
	var sb strings.Builder
	sb.WriteString("Requests per node by verb and resource, each side's mean over its runs (rest: per hour; watches: held at rest), kubelet / fork:\n\n")
	sb.WriteString("| request | " + strings.Join(phases, " | ") + " |\n|---" + strings.Repeat("|---", len(phases)) + "|\n")
	for _, k := range sorted {
		sb.WriteString("| " + k)
		for _, ph := range phases {
			sb.WriteString(" | " + meanRequests(kubelet, ph, k) + " / " + meanRequests(fork, ph, k))
		}
		sb.WriteString(" |\n")
	}
	return sb.String()
}

// meanRequests is the mean over runs of phase's requests k per node.
func meanRequests(runs map[int]*fleetResult, phase, k string) string {
	if len(runs) == 0 {
		return "-"
	}
	var sum float64
	for _, r := range runs {
		sum += r.Requests[phase][k]
	}
	return fmtNum(sum / float64(len(runs)))
}
