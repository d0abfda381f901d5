package kubeletbench

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// fleetResult is one run's figures (BenchmarkFleet), saved as JSON.
type fleetResult struct {
	Side  string `json:"side"`
	Nodes int    `json:"nodes"`
	Pods  int    `json:"pods"`
	Run   int    `json:"run"`
	// Claims: each pod had a CSI claim too (-fleet.claims).
	Claims bool `json:"claims,omitempty"`
	// Runtime is the nodes' container runtime: fleetFake or
	// fleetContainerd ("" in runs saved before it was recorded: fake).
	Runtime string `json:"runtime,omitempty"`
	// Figures are by fleetFigures' keys.
	Figures map[string]float64 `json:"figures"`
	// Requests are each phase's requests per node by "verb resource"
	// (rest's per hour).
	Requests map[string]map[string]float64 `json:"requests"`
}

// fleetFigures are the figures of a run, in the summary's order, with
// what each is. "/node" is a mean over the nodes.
var fleetFigures = []struct{ key, what string }{
	{"boot-s", "boot: kubelets started to every Node Ready, s"},
	{"boot-req/node", "boot: requests per node"},
	{"boot-vol-req/node", "boot: volume requests per node"},
	{"start-s", "start: pods created to every pod Running, s"},
	{"start-req/node", "start: requests per node"},
	{"start-vol-req/node", "start: volume requests per node"},
	{"create-running-p50-s", "start: pod created to Running p50, s"},
	{"create-running-p99-s", "start: pod created to Running p99, s"},
	{"start-kubelet-cpu-s/node", "start: kubelet CPU per node, s"},
	{"start-apiserver-cpu-s", "start: API server CPU, s"},
	{"rest-req/node/h", "rest: requests per node per hour"},
	{"rest-vol-req/node/h", "rest: volume requests per node per hour"},
	{"rest-get/node/min", "rest: GETs per node per minute"},
	{"rest-vol-get/node/min", "rest: volume GETs per node per minute"},
	{"watches/node", "rest: watches held per node"},
	{"vol-watches/node", "rest: volume watches held per node"},
	{"rest-kubelet-cpu-%/node", "rest: kubelet CPU per node, % of a core"},
	{"kubelet-rss-MiB/node", "rest: kubelet RSS per node, MiB"},
	{"rest-apiserver-cpu-%", "rest: API server CPU, % of a core"},
	{"apiserver-rss-MiB", "rest: API server RSS, MiB"},
	{"churn-s", "churn: share deleted until gone, then created until Running, s"},
	{"churn-req/node", "churn: requests per node"},
	{"churn-vol-req/node", "churn: volume requests per node"},
	{"churn-delete-gone-p50-s", "churn: pod deleted to gone p50, s"},
	{"churn-delete-gone-p99-s", "churn: pod deleted to gone p99, s"},
	{"churn-create-running-p50-s", "churn: pod created to Running p50, s"},
	{"churn-create-running-p99-s", "churn: pod created to Running p99, s"},
	{"churn-kubelet-cpu-s/node", "churn: kubelet CPU per node, s"},
	{"churn-apiserver-cpu-s", "churn: API server CPU, s"},
	{"delete-s", "delete: every pod deleted to every pod gone, s"},
	{"delete-gone-p50-s", "delete: pod deleted to gone p50, s"},
	{"delete-gone-p99-s", "delete: pod deleted to gone p99, s"},
	{"delete-kubelet-cpu-s/node", "delete: kubelet CPU per node, s"},
	{"whole-kubelet-cpu-s/node", "whole run: kubelet CPU per node (start of process to last pod gone), s"},
}

func newFleetResult(spec fleetSpec) *fleetResult {
	return &fleetResult{Side: spec.side, Nodes: spec.nodes, Pods: spec.pods, Run: spec.run, Claims: spec.claims, Runtime: spec.runtime,
		Figures: map[string]float64{}, Requests: map[string]map[string]float64{}}
}

// phase records a phase's figures from its samples and the nodes' counts.
func (r *fleetResult) phase(name string, from, to fleetSample, counts nodeCounts) {
	n := float64(r.Nodes)
	d := to.at.Sub(from.at)
	var kubelet time.Duration
	for i := range to.kubeletCPU {
		kubelet += to.kubeletCPU[i] - from.kubeletCPU[i]
	}
	all, vol := counts.total()
	perNode := counts.mean(r.Nodes)
	f := r.Figures
	r.claimPhase(name, d, counts)
	if name != "rest" {
		f[name+"-s"] = d.Seconds()
		f[name+"-req/node"] = float64(all) / n
		f[name+"-vol-req/node"] = float64(vol) / n
		f[name+"-kubelet-cpu-s/node"] = kubelet.Seconds() / n
		f[name+"-apiserver-cpu-s"] = (to.apiCPU - from.apiCPU).Seconds()
		r.Requests[name] = perNode
		return
	}
	perHour := float64(time.Hour) / float64(d)
	f["rest-req/node/h"] = float64(all) / n * perHour
	f["rest-vol-req/node/h"] = float64(vol) / n * perHour
	var gets, volGets float64
	for k, v := range perNode {
		verb, res, _ := strings.Cut(k, " ")
		if verb == "get" {
			gets += v
			if slices.Contains(fleetVolResources, res) {
				volGets += v
			}
		}
		perNode[k] = v * perHour
	}
	f["rest-get/node/min"] = gets * perHour / 60
	f["rest-vol-get/node/min"] = volGets * perHour / 60
	f["rest-kubelet-cpu-%/node"] = 100 * kubelet.Seconds() / n / d.Seconds()
	f["rest-apiserver-cpu-%"] = 100 * (to.apiCPU - from.apiCPU).Seconds() / d.Seconds()
	r.Requests["rest"] = perNode
}

// rest records the watches held at rest and the processes' RSS.
func (r *fleetResult) rest(b *testing.B, api int, nodes []fleetNode, watches nodeCounts) {
	all, vol := watches.total()
	r.Figures["watches/node"] = float64(all) / float64(r.Nodes)
	r.Figures["vol-watches/node"] = float64(vol) / float64(r.Nodes)
	r.Requests["watches"] = watches.mean(r.Nodes)
	var sum uint64
	for _, n := range nodes {
		rss, err := procRSS(n.proc.Pid())
		if err != nil {
			b.Fatal(err)
		}
		sum += rss
	}
	r.Figures["kubelet-rss-MiB/node"] = float64(sum) / float64(len(nodes)) / (1 << 20)
	rss, err := procRSS(api)
	if err != nil {
		b.Fatal(err)
	}
	r.Figures["apiserver-rss-MiB"] = float64(rss) / (1 << 20)
}

// latency records the p50 and p99 of d, in seconds, as name-p50-s and
// name-p99-s; nothing when d is empty (JSON has no NaN).
func (r *fleetResult) latency(name string, d []time.Duration) {
	if len(d) == 0 {
		return
	}
	r.Figures[name+"-p50-s"] = percentileMs(d, 0.50) / 1000
	r.Figures[name+"-p99-s"] = percentileMs(d, 0.99) / 1000
}

// wholeCPU records the kubelets' CPU time since they started.
func (r *fleetResult) wholeCPU(b *testing.B, nodes []fleetNode) {
	var sum time.Duration
	for _, n := range nodes {
		cpu, err := procCPU(n.proc.Pid())
		if err != nil {
			b.Fatal(err)
		}
		sum += cpu
	}
	r.Figures["whole-kubelet-cpu-s/node"] = sum.Seconds() / float64(len(nodes))
}

// report reports the figures as the benchmark's metrics.
func (r *fleetResult) report(b *testing.B) {
	for _, f := range slices.Concat(figuresOf(r.Runtime), fleetClaimFigures) {
		if v, ok := r.Figures[f.key]; ok {
			b.ReportMetric(v, f.key)
		}
	}
	b.ReportMetric(0, "ns/op")
}

// save writes the result as {dir}/nodes-{n}-pods-{p}-run-{r}-{side}.json
// ({p}-claims with claims), with -{runtime} before .json on a real runtime.
func (r *fleetResult) save(dir string) error {
	data, err := json.MarshalIndent(r, "", " ")
	if err != nil {
		return err
	}
	name := fmt.Sprintf("nodes-%d-pods-%d%s-run-%d-%s.json", r.Nodes, r.Pods, r.claimsSuffix(), r.Run, r.Side)
	if rt := fleetRuntimeOf(r.Runtime); rt != fleetFake {
		name = strings.TrimSuffix(name, ".json") + "-" + rt + ".json"
	}
	if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
		return fmt.Errorf("saving the run's figures: %w", err)
	}
	return nil
}

// fmtNum formats v with a precision that suits its size.
func fmtNum(v float64) string {
	switch a := math.Abs(v); {
	case math.IsNaN(v):
		return "-"
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}
