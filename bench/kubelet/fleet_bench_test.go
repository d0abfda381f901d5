package kubeletbench

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodevol/nodevol/internal/roottest"
)

// BenchmarkFleet runs a simulated cluster, as kubemark does with hollow
// nodes: -fleet.nodes kubelet processes of one side, each its own node
// (its own root directory, client certificate and fake container runtime,
// k8s.io/cri-client/pkg/fake), against one testenv kube-apiserver with an
// audit log; the stock kubelet v1.37.2 ("kubelet") or nodevol's fork of it
// ("fork", make kubelet-fork's bin/kubelet, -fleet.fork). With one node
// and many pods it is the fork as a whole process against the kubelet.
//
// Each node gets -fleet.pods pods, each with every kind of volume the fork
// runs on the fake runtime: a configMap and a secret of its own, the
// projected kube-api-access volume (a token, the namespace's
// kube-root-ca.crt, the namespace), a downwardAPI volume and an emptyDir
// (no CSI claim unless -fleet.claims: then one more, a claim of its own
// on a CSI driver each node runs, fleet_claims_test.go). A run has four
// phases, each measured per node from the audit log (bench/internal/apiaudit),
// the API server's /metrics and /proc:
//
//   - boot: from the kubelets' start until every Node is Ready (and,
//     with claims, every node's driver registered);
//   - start: from the pods' creation until every pod is Running;
//   - rest: -fleet.idle at rest, extrapolated to an hour; the watches
//     the nodes hold (apiserver_longrunning_requests, less the
//     benchmark's own) are taken at its end;
//   - churn: -fleet.churn of each node's pods deleted until gone, then
//     created again (new names, same objects) until Running;
//   - delete: every pod deleted until gone.
//
// The sides alternate (run r starts with the kubelet when r is even), each
// run with an API server of its own. -fleet.run and -fleet.side pick one
// run of one side, so that a caller can run each as a process of its own
// (make bench-fleet does, each under FLEET_LOCK). Each run's figures are
// saved as JSON in -fleet.dir; the summary (logged, and written as
// markdown to -fleet.out when set) is made from every run saved there:
// each figure's range over the runs per side and the range of the runs'
// fork/kubelet ratios. -fleet.profile saves a CPU profile of each
// kubelet from the delete phase's start (fleet_profile_test.go).
// -fleet.runtime containerd runs one node on real containers instead
// (fleet_runtime_test.go): containerd and runc, and the runtime's CPU
// and memory beside the kubelet's. Root only.
func BenchmarkFleet(b *testing.B) {
	roottest.Require(b)
	nodes, err := intList(*fleetNodes)
	if err != nil {
		b.Fatal(err)
	}
	pods, err := intList(*fleetPods)
	if err != nil {
		b.Fatal(err)
	}
	if err := checkFleetRuntime(*fleetRuntime, nodes); err != nil {
		b.Fatal(err)
	}
	if err := os.MkdirAll(*fleetDir, 0o755); err != nil {
		b.Fatal(err)
	}
	for _, n := range nodes {
		for _, p := range pods {
			for r := range *fleetRuns {
				if *fleetOnlyRun >= 0 && r != *fleetOnlyRun {
					continue
				}
				for _, side := range fleetSides(r) {
					b.Run(fmt.Sprintf("nodes=%d/pods=%d/run=%d/side=%s", n, p, r, side), func(b *testing.B) {
						spec := fleetSpec{side: side, bin: fleetBinary(b, side), nodes: n, pods: p, run: r, claims: *fleetClaims, runtime: *fleetRuntime}
						res := runFleet(b, spec)
						res.report(b)
						if err := res.save(*fleetDir); err != nil {
							b.Fatal(err)
						}
					})
				}
			}
		}
	}
	sum, err := loadFleet(*fleetDir)
	if err != nil {
		b.Fatal(err)
	}
	out := sum.markdown()
	b.Logf("fleet summary of %s:\n%s", *fleetDir, out)
	if *fleetOut != "" {
		if err := os.WriteFile(*fleetOut, []byte(out), 0o644); err != nil {
			b.Fatal(err)
		}
	}
}

var (
	fleetNodes    = flag.String("fleet.nodes", "5", "BenchmarkFleet: nodes (kubelet processes), a comma-separated list")
	fleetPods     = flag.String("fleet.pods", "30", "BenchmarkFleet: pods per node, a comma-separated list")
	fleetRuns     = flag.Int("fleet.runs", 2, "BenchmarkFleet: runs per side, the sides alternated")
	fleetOnlyRun  = flag.Int("fleet.run", -1, "BenchmarkFleet: only this run (0 to fleet.runs-1); -1: all")
	fleetOnlySide = flag.String("fleet.side", "", "BenchmarkFleet: only this side (kubelet or fork); empty: both")
	fleetIdle     = flag.Duration("fleet.idle", 2*time.Minute, "BenchmarkFleet: the window at rest")
	fleetChurn    = flag.Float64("fleet.churn", 1.0/3, "BenchmarkFleet: the share of each node's pods deleted and created again")
	fleetFork     = flag.String("fleet.fork", filepath.Join("..", "..", "bin", "kubelet"), "BenchmarkFleet: the fork's binary (make kubelet-fork)")
	fleetDir      = flag.String("fleet.dir", filepath.Join(os.TempDir(), "nodevol-fleet"), "BenchmarkFleet: where each run's figures are saved, and the summary's runs are read")
	fleetOut      = flag.String("fleet.out", "", "BenchmarkFleet: a file for the summary's markdown")
	fleetProfile  = flag.Duration("fleet.profile", 0, "BenchmarkFleet: a CPU profile this long of each kubelet from the delete phase's start, "+
		"saved in -fleet.dir (the kubelet's /debug/pprof/profile); 0: none")
)

// fleetSides are run r's sides in order: alternated, the kubelet first when
// r is even; only -fleet.side when set.
func fleetSides(r int) []string {
	if *fleetOnlySide != "" {
		return []string{*fleetOnlySide}
	}
	if r%2 == 1 {
		return []string{"fork", "kubelet"}
	}
	return []string{"kubelet", "fork"}
}

// fleetBinary is side's kubelet binary: the stock one (built once into the
// user's cache) or the fork's.
func fleetBinary(b *testing.B, side string) string {
	b.Helper()
	switch side {
	case "kubelet":
		return kubeletBin(b)
	case "fork":
		return forkBin(b)
	}
	b.Fatalf("side %q: kubelet or fork", side)
	return ""
}

// forkBin is the fork's binary, which make kubelet-fork builds.
func forkBin(b *testing.B) string {
	b.Helper()
	p, err := filepath.Abs(*fleetFork)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		b.Fatalf("the fork's binary (make kubelet-fork): %v", err)
	}
	return p
}

// intList parses a comma-separated list of positive integers.
func intList(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q: not a list of positive integers", s)
		}
		out = append(out, n)
	}
	return out, nil
}
