package volumemanager

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/podvol"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
)

// sizeLimitEnv is a manager with a pod whose emptyDir "cache" has a
// sizeLimit of 64Ki and whose emptyDir "free" has none, both directories
// on the test's disk; reports are sent to got.
type sizeLimitEnv struct {
	*env
	pod   *v1.Pod
	dir   string // the "cache" emptyDir's directory
	free  string // the "free" emptyDir's directory
	got   chan SizeLimitExceeded
	prom  *prometheus.Registry
	clock *testingclock.FakeClock
}

func newSizeLimitEnv(t *testing.T, off bool) *sizeLimitEnv {
	t.Helper()
	limit := resource.MustParse("64Ki")
	s := &sizeLimitEnv{got: make(chan SizeLimitExceeded, 10), prom: prometheus.NewRegistry(), clock: testingclock.NewFakeClock(time.Now())}
	s.env = newEnv(t, envOptions{clock: s.clock, registerer: s.prom, sizeLimit: SizeLimitConfig{Off: off,
		OnExceeded: func(_ context.Context, e SizeLimitExceeded) { s.got <- e }}})
	s.pod = csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{
		{Name: "cache", Source: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{SizeLimit: &limit}}},
		{Name: "free", Source: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
	}})
	if err := s.mount(s.pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, mv := range s.vm.GetMountedVolumesForPod(s.pod.UID) {
		switch mv.SpecName {
		case "cache":
			s.dir = mv.Path
		case "free":
			s.free = mv.Path
		}
	}
	if s.dir == "" || s.free == "" {
		t.Fatalf("the pod's emptyDirs are not mounted: %+v", s.vm.GetMountedVolumesForPod(s.pod.UID))
	}
	return s
}

// write writes a file of size bytes into dir.
func (s *sizeLimitEnv) write(dir, name string, size int) {
	s.t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), make([]byte, size), 0o644); err != nil {
		s.t.Fatal(err)
	}
}

// measure asks for the pod's usage, as a stats summary does.
func (s *sizeLimitEnv) measure() {
	s.t.Helper()
	if _, err := s.vm.GetVolumeStats(context.Background(), s.pod.UID); err != nil {
		s.t.Fatal(err)
	}
}

// reports returns the reports made so far.
func (s *sizeLimitEnv) reports() []SizeLimitExceeded {
	var out []SizeLimitExceeded
	for {
		select {
		case e := <-s.got:
			out = append(out, e)
		default:
			return out
		}
	}
}

// overLimit is the gauge's value; -1 when it is not registered.
func (s *sizeLimitEnv) overLimit() float64 {
	s.t.Helper()
	mfs, err := s.prom.Gather()
	if err != nil {
		s.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "nodevol_volumes_over_size_limit" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}

// sizeLimitEvents are the SizeLimitExceeded events recorded so far.
func (s *sizeLimitEnv) sizeLimitEvents() []string {
	var out []string
	for {
		select {
		case e := <-s.events.Events:
			if strings.Contains(e, reasonSizeLimitExceeded) {
				out = append(out, e)
			}
		default:
			return out
		}
	}
}

// TestSizeLimitReportedFromStats: an emptyDir whose usage exceeds its
// sizeLimit is reported from the usage a caller asks for (GetVolumeStats),
// once per crossing: an event in the kubelet's eviction words (without
// the eviction), the gauge, the callback; back under its limit, the gauge
// drops, and the next crossing is reported again. A volume without a
// limit is never reported, whatever its usage.
func TestSizeLimitReportedFromStats(t *testing.T) {
	s := newSizeLimitEnv(t, false)
	s.write(s.free, "big", 1<<20)
	s.measure()
	if got := s.reports(); len(got) != 0 || s.overLimit() != 0 {
		t.Fatalf("under its limit: reports %+v, gauge %v; want none", got, s.overLimit())
	}
	s.write(s.dir, "big", 1<<20)
	s.measure()
	got := s.reports()
	if len(got) != 1 || got[0].Volume != "cache" || got[0].Pod.UID != s.pod.UID || got[0].Limit.String() != "64Ki" || got[0].UsedBytes < 1<<20 {
		t.Fatalf("over its limit: reports %+v, want one of volume cache of the pod, limit 64Ki, at least 1MiB used", got)
	}
	want := `Warning SizeLimitExceeded Usage of EmptyDir volume "cache" exceeds its sizeLimit "64Ki"`
	if ev := s.sizeLimitEvents(); len(ev) != 1 || ev[0] != want {
		t.Errorf("events %q, want [%q]", ev, want)
	}
	if g := s.overLimit(); g != 1 {
		t.Errorf("gauge %v, want 1", g)
	}
	s.measure() // still over: not reported again
	if got := s.reports(); len(got) != 0 || len(s.sizeLimitEvents()) != 0 || s.overLimit() != 1 {
		t.Errorf("still over: reports %+v, gauge %v; want no new report, gauge 1", got, s.overLimit())
	}
	if err := os.Remove(filepath.Join(s.dir, "big")); err != nil {
		t.Fatal(err)
	}
	s.measure()
	if g := s.overLimit(); g != 0 {
		t.Errorf("back under: gauge %v, want 0", g)
	}
	s.write(s.dir, "again", 1<<20)
	s.measure()
	if got := s.reports(); len(got) != 1 {
		t.Errorf("over again: reports %+v, want one", got)
	}
	s.unmount(s.pod)
	// The pod gone, the next round forgets it.
	s.vm.sizeLimits.due(s.vm.asw, s.vm.volumes)
	if g := s.overLimit(); g != 0 {
		t.Errorf("the pod gone: gauge %v, want 0", g)
	}
}

// TestSizeLimitMeasuredByRun: with nobody asking for usage, Run measures
// the volumes with a limit every VolumeStatsPeriod and reports the one
// over it.
func TestSizeLimitMeasuredByRun(t *testing.T) {
	s := newSizeLimitEnv(t, false)
	s.write(s.dir, "big", 1<<20)
	var got SizeLimitExceeded
	// The measurement is due once a period has passed on the manager's
	// clock; its timer may not be armed yet when the clock is stepped:
	// step at each poll until the report comes.
	eventually(t, "a report of the emptyDir over its sizeLimit", func() bool {
		select {
		case got = <-s.got:
			return true
		default:
			s.clock.Step(time.Minute)
			return false
		}
	})
	if got.Volume != "cache" {
		t.Errorf("report %+v, want volume cache", got)
	}
}

// TestSizeLimitOff: with the report off (a kubelet fork), a volume over
// its limit is neither reported nor counted.
func TestSizeLimitOff(t *testing.T) {
	s := newSizeLimitEnv(t, true)
	s.write(s.dir, "big", 1<<20)
	s.measure()
	if got := s.reports(); len(got) != 0 || len(s.sizeLimitEvents()) != 0 {
		t.Errorf("reports %+v with the report off, want none", got)
	}
	if g := s.overLimit(); g != -1 {
		t.Errorf("nodevol_volumes_over_size_limit is %v with the report off, want it not registered", g)
	}
}

// TestSizeLimitDue: Run measures only the volumes with a limit, and not
// one that something measured in the last period.
func TestSizeLimitDue(t *testing.T) {
	s := newSizeLimitEnv(t, false)
	// The env's manager's state, with a clock of the test's own (the
	// manager's Run measures on its own).
	clk := testingclock.NewFakeClock(time.Now())
	sl := &sizeLimits{clock: clk, period: time.Minute, over: map[oe.Key]bool{}, measured: map[oe.Key]time.Time{}}
	due := func() []podvol.UniqueVolumeName {
		var out []podvol.UniqueVolumeName
		for uid, names := range sl.due(s.vm.asw, s.vm.volumes) {
			if uid != s.pod.UID {
				t.Errorf("due: pod %s, want only %s", uid, s.pod.UID)
			}
			out = append(out, names...)
		}
		return out
	}
	names := due()
	if len(names) != 1 || !strings.HasSuffix(string(names[0]), "-cache") {
		t.Fatalf("never measured: %v due, want the volume with a limit alone", names)
	}
	limit := resource.MustParse("64Ki")
	sl.observe(context.Background(), names[0], podvol.PodVolume{Pod: podvol.PodRef{UID: s.pod.UID}, SpecName: "cache"}, &limit, 0)
	if got := due(); len(got) != 0 {
		t.Errorf("just measured: %v due, want none", got)
	}
	clk.Step(time.Minute)
	if got := due(); len(got) != 1 {
		t.Errorf("a period later: %v due, want %v", got, names)
	}
}
