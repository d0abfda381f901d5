package kubeletbench

import (
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/internal/realnode"
	"github.com/nodevol/nodevol/internal/roottest"
)

var updateGolden = flag.Bool("fleet.update-golden", false, "TestFleetSummaryFakeGolden: rewrite testdata/fleet-summary-fake.md")

// fleetSummaryFixture are fake-runtime runs whose summary is pinned byte
// for byte (fleetSummaryGolden, made by the summary before runtimes).
func fleetSummaryFixture() []*fleetResult {
	return []*fleetResult{
		{Side: "kubelet", Nodes: 1, Pods: 100, Run: 0, Figures: map[string]float64{"boot-s": 4.2, "start-kubelet-cpu-s/node": 2.5,
			"kubelet-rss-MiB/node": 101, "rest-kubelet-cpu-%/node": 1.25, "delete-gone-p50-s": 0.8, "whole-kubelet-cpu-s/node": 12},
			Requests: map[string]map[string]float64{"start": {"get configmaps": 100, "list pods": 1}, "rest": {"watch secrets": 4}}},
		{Side: "fork", Nodes: 1, Pods: 100, Run: 0, Figures: map[string]float64{"boot-s": 4.0, "start-kubelet-cpu-s/node": 2.0,
			"kubelet-rss-MiB/node": 110, "rest-kubelet-cpu-%/node": 1.0, "delete-gone-p50-s": 0.6, "whole-kubelet-cpu-s/node": 10},
			Requests: map[string]map[string]float64{"start": {"get configmaps": 50}}},
		{Side: "fork", Nodes: 1, Pods: 100, Run: 1, Figures: map[string]float64{"boot-s": 5.0, "start-kubelet-cpu-s/node": 2.2}},
		{Side: "kubelet", Nodes: 1, Pods: 100, Run: 1, Figures: map[string]float64{"boot-s": 4.4, "start-kubelet-cpu-s/node": 2.4}},
		{Side: "kubelet", Nodes: 5, Pods: 30, Run: 0, Figures: map[string]float64{"watches/node": 62, "boot-s": 9}},
	}
}

// TestFleetSummaryFakeGolden pins the summary of fake-runtime runs byte for
// byte: testdata/fleet-summary-fake.md was written by the summary as it was
// before runtimes were recorded, and runs saved then (no runtime) or since
// (runtime "fake") give it alike. A change to fleetFigures changes it:
// rewrite it with -args -fleet.update-golden and read the diff.
func TestFleetSummaryFakeGolden(t *testing.T) {
	golden := filepath.Join("testdata", "fleet-summary-fake.md")
	for _, runtime := range []string{"", fleetFake} {
		dir := t.TempDir()
		for _, r := range fleetSummaryFixture() {
			r.Runtime = runtime
			if err := r.save(dir); err != nil {
				t.Fatal(err)
			}
		}
		s, err := loadFleet(dir)
		if err != nil {
			t.Fatal(err)
		}
		got := s.markdown()
		if *updateGolden {
			if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(golden)
		if err != nil {
			t.Fatal(err)
		}
		if got != string(want) {
			t.Errorf("runtime %q: the summary differs from %s:\n%s", runtime, golden, got)
		}
	}
}

// TestFleetSummaryContainerd checks a directory holding runs on both
// runtimes: a table each, the containerd one's header naming it and its
// runtime rows right after the kubelet's rows they stand beside.
func TestFleetSummaryContainerd(t *testing.T) {
	dir := t.TempDir()
	runs := fleetSummaryFixture()[:2]
	for _, side := range []string{"kubelet", "fork"} {
		cpu := map[string]float64{"kubelet": 2, "fork": 1}[side]
		runs = append(runs, &fleetResult{Side: side, Nodes: 1, Pods: 100, Run: 0, Runtime: fleetContainerd,
			Figures: map[string]float64{"start-kubelet-cpu-s/node": cpu, "start-runtime-cpu-s": 4, "start-node-cpu-s": cpu + 4,
				"runtime-procs": 101, "whole-node-cpu-s": 30}})
	}
	for _, r := range runs {
		if err := r.save(dir); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "nodes-1-pods-100-run-0-fork-containerd.json")); err != nil {
		t.Errorf("a containerd run is not saved apart from the fake one's: %v", err)
	}
	s, err := loadFleet(dir)
	if err != nil {
		t.Fatal(err)
	}
	md := s.markdown()
	fake, real, ok := strings.Cut(md, "### 1 nodes, 100 pods each, on containerd (runs: kubelet 1, fork 1)\n")
	if !ok {
		t.Fatalf("no containerd table:\n%s", md)
	}
	if !strings.HasPrefix(fake, "### 1 nodes, 100 pods each (runs: kubelet 1, fork 1)\n") || strings.Contains(fake, "runtime") {
		t.Errorf("the fake runs' table:\n%s", fake)
	}
	for _, want := range []string{
		"| start: kubelet CPU per node, s | 2.00 | 1.00 | 0.50 |\n" +
			"| start: runtime CPU (containerd, its shims, runc), s | 4.00 | 4.00 | 1.00 |\n" +
			"| start: node CPU (kubelet and runtime), s | 6.00 | 5.00 | 0.83 |\n" +
			"| start: API server CPU, s | - | - | - |\n",
		"| rest: runtime processes (containerd and its shims) | 101 | 101 | 1.00 |\n",
		"| whole run: node CPU (kubelet and runtime), s | 30.0 | 30.0 | 1.00 |\n\n",
	} {
		if !strings.Contains(real, want) {
			t.Errorf("the containerd table lacks %q:\n%s", want, real)
		}
	}
}

func TestFleetFiguresOf(t *testing.T) {
	if got := figuresOf(fleetFake); !slices.Equal(got, fleetFigures) {
		t.Errorf("figuresOf(fake) = %v, want fleetFigures", got)
	}
	if got := figuresOf(""); !slices.Equal(got, fleetFigures) {
		t.Errorf("figuresOf(\"\") = %v, want fleetFigures", got)
	}
	got := figuresOf(fleetContainerd)
	if len(got) != len(fleetFigures)+len(fleetRuntimeFigures) {
		t.Fatalf("figuresOf(containerd): %d figures, want %d", len(got), len(fleetFigures)+len(fleetRuntimeFigures))
	}
	var keys []string
	for _, f := range got {
		keys = append(keys, f.key)
	}
	// fleetFigures keep their order; each runtime row follows its anchor.
	var kept []struct{ key, what string }
	for _, f := range got {
		if !slices.ContainsFunc(fleetRuntimeFigures, func(r struct{ after, key, what string }) bool { return r.key == f.key }) {
			kept = append(kept, f)
		}
	}
	if !slices.Equal(kept, fleetFigures) {
		t.Errorf("figuresOf(containerd) reorders fleetFigures: %v", keys)
	}
	for _, r := range fleetRuntimeFigures {
		i := slices.Index(keys, r.key)
		if i < 1 || keys[i-1] != r.after {
			t.Errorf("%s at %d, not right after %s: %v", r.key, i, r.after, keys)
		}
	}
}

func TestFleetRuntimePhase(t *testing.T) {
	at := time.Unix(1000, 0)
	from := fleetSample{at: at, kubeletCPU: []time.Duration{time.Second}, runtimeCPU: 2 * time.Second}
	to := fleetSample{at: at.Add(10 * time.Second), kubeletCPU: []time.Duration{3 * time.Second}, runtimeCPU: 7 * time.Second}
	r := &fleetResult{Runtime: fleetContainerd, Figures: map[string]float64{}}
	r.runtimePhase("start", from, to)
	r.runtimePhase("rest", from, to)
	want := map[string]float64{"start-runtime-cpu-s": 5, "start-node-cpu-s": 7, "rest-runtime-cpu-%": 50, "rest-node-cpu-%": 70}
	for k, v := range want {
		if r.Figures[k] != v {
			t.Errorf("%s = %v, want %v", k, r.Figures[k], v)
		}
	}
	if len(r.Figures) != len(want) {
		t.Errorf("figures %v, want %v", r.Figures, want)
	}
	fake := &fleetResult{Runtime: fleetFake, Figures: map[string]float64{}}
	fake.runtimePhase("start", from, to)
	if len(fake.Figures) != 0 {
		t.Errorf("fake runtime: figures %v, want none", fake.Figures)
	}
}

func TestCheckFleetRuntime(t *testing.T) {
	for _, c := range []struct {
		runtime string
		nodes   []int
		ok      bool
	}{
		{fleetFake, []int{5, 20}, true},
		{fleetContainerd, []int{1}, true},
		{fleetContainerd, []int{1, 2}, false},
		{"crio", []int{1}, false},
		{"", []int{1}, false},
	} {
		if err := checkFleetRuntime(c.runtime, c.nodes); (err == nil) != c.ok {
			t.Errorf("checkFleetRuntime(%q, %v) = %v", c.runtime, c.nodes, err)
		}
	}
}

func TestParseCgroupUsage(t *testing.T) {
	if d, err := parseCgroupUsage("1500000000\n", false); err != nil || d != 1500*time.Millisecond {
		t.Errorf("cpuacct.usage: %v, %v", d, err)
	}
	v2 := "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n"
	if d, err := parseCgroupUsage(v2, true); err != nil || d != 2500*time.Millisecond {
		t.Errorf("cpu.stat: %v, %v", d, err)
	}
	for _, bad := range []struct {
		data string
		v2   bool
	}{{"", false}, {"x", false}, {"user_usec 1\n", true}, {"usage_usec x\n", true}} {
		if _, err := parseCgroupUsage(bad.data, bad.v2); err == nil {
			t.Errorf("parseCgroupUsage(%q, %v): no error", bad.data, bad.v2)
		}
	}
}

func TestParsePSS(t *testing.T) {
	data := "55d0c0000000-7ffd4b5fe000 ---p 00000000 00:00 0 [rollup]\nRss: 12000 kB\nPss: 4096 kB\nPss_Anon: 2048 kB\n"
	if got, err := parsePSS(data); err != nil || got != 4096<<10 {
		t.Errorf("parsePSS = %d, %v", got, err)
	}
	if _, err := parsePSS("Rss: 1 kB\n"); err == nil {
		t.Error("parsePSS without Pss: no error")
	}
	if pss, err := procPSS(os.Getpid()); err != nil || pss == 0 {
		t.Errorf("procPSS(self) = %d, %v", pss, err)
	}
}

// TestFleetRealPod checks the pod on containerd: the image realnode
// imports, never pulled, the command, the grace period, and every volume
// and mount of the fleet's pod kept.
func TestFleetRealPod(t *testing.T) {
	fake := fleetPod("fleet-000", 3, 1)
	real := fleetRealPod(fleetPod("fleet-000", 3, 1))
	c := real.Spec.Containers[0]
	if c.Image != realnode.BusyboxImage || c.ImagePullPolicy != v1.PullNever || !slices.Equal(c.Command, []string{"sh", "-c", fleetSleep}) {
		t.Errorf("the container: %s %s %q", c.Image, c.ImagePullPolicy, c.Command)
	}
	if g := real.Spec.TerminationGracePeriodSeconds; g == nil || *g != fleetGrace {
		t.Errorf("terminationGracePeriodSeconds %v, want %d", g, fleetGrace)
	}
	if len(real.Spec.Volumes) != 5 || !slices.EqualFunc(real.Spec.Volumes, fake.Spec.Volumes, func(a, b v1.Volume) bool { return a.Name == b.Name }) ||
		!reflect.DeepEqual(c.VolumeMounts, fake.Spec.Containers[0].VolumeMounts) || !real.Spec.HostNetwork || real.Name != fake.Name {
		t.Errorf("the pod's volumes, mounts or network changed:\n%+v\nwant\n%+v", real.Spec, fake.Spec)
	}
	if fake.Spec.TerminationGracePeriodSeconds != nil || fake.Spec.Containers[0].Command != nil {
		t.Errorf("the fake runtime's pod changed: %+v", fake.Spec)
	}
}

// TestFleetSleepExitsOnTERM runs fleetSleep in this machine's busybox sh,
// as the container does: at SIGTERM it exits 0 at once, its sleep killed.
func TestFleetSleepExitsOnTERM(t *testing.T) {
	if _, err := os.Stat("/bin/busybox"); err != nil {
		t.Skip("no /bin/busybox (make deps installs busybox-static)")
	}
	cmd := exec.Command("/bin/busybox", "sh", "-c", fleetSleep)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }()
	// The shell traps TERM only once it runs: wait for its sleep.
	waitFor(t, "the sleep to start", func() bool { return len(groupPids(cmd.Process.Pid)) == 2 })
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("at SIGTERM: %v, want exit 0", err)
		}
	case <-time.After(time.Duration(fleetGrace) * time.Second):
		t.Fatalf("still running %ds after SIGTERM: the kubelet would have to kill it", fleetGrace)
	}
	waitFor(t, "the sleep to be killed", func() bool { return len(groupPids(cmd.Process.Pid)) == 0 })
}

// groupPids are the live processes of process group pgid.
func groupPids(pgid int) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		_, rest, ok := strings.Cut(string(data), ") ")
		f := strings.Fields(rest)
		// rest starts at field 3 (state); pgrp is field 5.
		if ok && len(f) > 2 && f[0] != "Z" && f[2] == strconv.Itoa(pgid) {
			pid, _ := strconv.Atoi(e.Name())
			out = append(out, pid)
		}
	}
	return out
}

// waitFor polls cond every 10 ms for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: 10 s", what)
		}
	}
}

// TestFleetCPUCgroup moves a busy child into a CPU accounting cgroup: its
// CPU and that of a process it starts are counted there, and the cgroup is
// removed once they are gone. Root only.
func TestFleetCPUCgroup(t *testing.T) {
	roottest.Require(t)
	g, err := newCPUCgroup("nodevol-fleet-test-" + strconv.Itoa(os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := g.remove(); err != nil {
			t.Error(err)
		}
	}()
	// The shell waits to be moved, then spins in a child of its own.
	cmd := exec.Command("/bin/sh", "-c", `read x; sh -c 'i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done'`)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := g.add(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if pids, err := g.pids(); err != nil || !slices.Equal(pids, []int{cmd.Process.Pid}) {
		t.Errorf("pids = %v, %v; want [%d]", pids, err, cmd.Process.Pid)
	}
	in.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	used, err := g.usage()
	if err != nil {
		t.Fatal(err)
	}
	if used < 10*time.Millisecond {
		t.Errorf("the cgroup's CPU time %v: the child's spin not counted", used)
	}
}

func TestFleetShimID(t *testing.T) {
	shim := []string{"/usr/bin/containerd-shim-runc-v2", "-namespace", "k8s.io", "-id", "f9f2cd8c", "-address", "/tmp/x/containerd.sock", ""}
	if got := shimID(shim); got != "f9f2cd8c" {
		t.Errorf("shimID(shim) = %q", got)
	}
	for _, other := range [][]string{nil, {"/usr/bin/containerd", "--config", "/tmp/x/containerd.toml"}, {"/usr/bin/containerd-shim-runc-v2", "-id"}} {
		if got := shimID(other); got != "" {
			t.Errorf("shimID(%q) = %q, want none", other, got)
		}
	}
}
