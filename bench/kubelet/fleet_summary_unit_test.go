package kubeletbench

import (
	"os"
	"strings"
	"testing"
)

func TestFleetSummary(t *testing.T) {
	dir := t.TempDir()
	for _, r := range []*fleetResult{
		{Side: "kubelet", Nodes: 2, Pods: 3, Run: 0, Figures: map[string]float64{"watches/node": 10, "boot-s": 4},
			Requests: map[string]map[string]float64{"rest": {"get configmaps": 120}}},
		{Side: "kubelet", Nodes: 2, Pods: 3, Run: 1, Figures: map[string]float64{"watches/node": 12, "boot-s": 4}},
		{Side: "fork", Nodes: 2, Pods: 3, Run: 0, Figures: map[string]float64{"watches/node": 5, "boot-s": 4},
			Requests: map[string]map[string]float64{"rest": {"watch pods": 2}}},
		// Run 1 of the fork missing: its ratio is left out.
	} {
		if err := r.save(dir); err != nil {
			t.Fatal(err)
		}
	}
	s, err := loadFleet(dir)
	if err != nil {
		t.Fatal(err)
	}
	md := s.markdown()
	for _, want := range []string{
		"### 2 nodes, 3 pods each (runs: kubelet 2, fork 1)",
		"| rest: watches held per node | 10.0–12.0 | 5.00 | 0.50 |",
		"| boot: kubelets started to every Node Ready, s | 4.00 | 4.00 | 1.00 |",
		"| rest: kubelet RSS per node, MiB | - | - | - |",
		"| get configmaps | 0.00 / 0.00 | 0.00 / 0.00 | 60.0 / 0.00 |",
		"| watch pods | 0.00 / 0.00 | 0.00 / 0.00 | 0.00 / 2.00 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the summary lacks %q:\n%s", want, md)
		}
	}
}

func TestFleetProcCPU(t *testing.T) {
	cpu, err := procCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if cpu < 0 {
		t.Errorf("procCPU = %v", cpu)
	}
	rss, err := procRSS(os.Getpid())
	if err != nil || rss == 0 {
		t.Errorf("procRSS = %d, %v", rss, err)
	}
	if _, err := procCPU(-1); err == nil {
		t.Error("procCPU of no process: no error")
	}
}

func TestFleetIntList(t *testing.T) {
	got, err := intList("5, 20")
	if err != nil || len(got) != 2 || got[0] != 5 || got[1] != 20 {
		t.Errorf("intList(5, 20) = %v, %v", got, err)
	}
	for _, bad := range []string{"", "0", "a", "5,-1"} {
		if _, err := intList(bad); err == nil {
			t.Errorf("intList(%q): no error", bad)
		}
	}
}
