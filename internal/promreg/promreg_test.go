package promreg

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// gather returns "name{label=value,...} value" lines of every sample.
func gather(t *testing.T, reg prometheus.Gatherer) string {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			b.WriteString(f.GetName() + "{")
			for i, l := range m.GetLabel() {
				if i > 0 {
					b.WriteString(",")
				}
				b.WriteString(l.GetName() + "=" + l.GetValue())
			}
			fmt.Fprintf(&b, "} %g\n", value(m))
		}
	}
	return b.String()
}

func value(m *dto.Metric) float64 {
	if m.GetCounter() != nil {
		return m.GetCounter().GetValue()
	}
	return m.GetGauge().GetValue()
}

// TestReuse: the second registration of an identical collector returns
// the first; a collector that is not of the wanted type is an error.
func TestReuse(t *testing.T) {
	reg := prometheus.NewRegistry()
	opts := prometheus.CounterOpts{Name: "things_total", Help: "Things."}
	first, err := Reuse(reg, prometheus.NewCounter(opts))
	if err != nil {
		t.Fatal(err)
	}
	second, err := Reuse(reg, prometheus.NewCounter(opts))
	if err != nil {
		t.Fatal(err)
	}
	first.Inc()
	second.Inc()
	if got := gather(t, reg); got != "things_total{} 2\n" {
		t.Errorf("gathered %q, want things_total 2: both owners count into one counter", got)
	}
	if _, err := Reuse[prometheus.Gauge](reg, prometheus.NewGauge(prometheus.GaugeOpts{Name: "things_total", Help: "Things."})); err == nil || !strings.Contains(err.Error(), "already registered") {
		t.Errorf("Reuse as another type = %v, want an error", err)
	}
	if _, err := Reuse(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: "things_total", Help: "Other help."})); err == nil {
		t.Error("Reuse of a collector with another help text succeeded")
	}
}

type constCollector struct {
	desc  *prometheus.Desc
	value map[string]float64
}

func (c *constCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }
func (c *constCollector) Collect(ch chan<- prometheus.Metric) {
	for l, v := range c.value {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v, l)
	}
}

// TestFan: per-owner collectors of the same descriptors are all
// collected; a series two owners report is reported once, the first's.
func TestFan(t *testing.T) {
	reg := prometheus.NewRegistry()
	desc := func() *prometheus.Desc { return prometheus.NewDesc("owned", "Owned things.", []string{"owner"}, nil) }
	a := &constCollector{desc(), map[string]float64{"a": 1, "shared": 10}}
	b := &constCollector{desc(), map[string]float64{"b": 2, "shared": 20}}
	for _, c := range []prometheus.Collector{a, b} {
		if err := Fan(reg, c); err != nil {
			t.Fatal(err)
		}
	}
	want := "owned{owner=a} 1\nowned{owner=b} 2\nowned{owner=shared} 10\n"
	if got := gather(t, reg); got != want {
		t.Errorf("gathered\n%s\nwant\n%s", got, want)
	}
	plain := prometheus.NewRegistry()
	plain.MustRegister(&constCollector{desc(), nil})
	if err := Fan(plain, a); err == nil {
		t.Error("Fan onto a collector not registered through Fan succeeded")
	}
}
