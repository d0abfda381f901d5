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

// TestJoin: per-owner collectors of the same descriptors are all
// collected, through Fan (a series two owners report is reported once,
// the first's) or Sum (once, with the sum of the values). A collector of
// the same descriptors registered otherwise, as the kubelet's own, is
// collected first, with the others; Fan onto a Sum is an error.
func TestJoin(t *testing.T) {
	desc := func() *prometheus.Desc { return prometheus.NewDesc("owned", "Owned things.", []string{"owner"}, nil) }
	for _, tc := range []struct {
		name    string
		join    func(prometheus.Registerer, prometheus.Collector) error
		foreign bool // a collector registered beforehand, not through join
		want    string
	}{
		{"fan", Fan, false, "owned{owner=a} 1\nowned{owner=b} 2\nowned{owner=shared} 10\n"},
		{"sum", Sum, false, "owned{owner=a} 1\nowned{owner=b} 2\nowned{owner=shared} 30\n"},
		{"fan onto a foreign collector", Fan, true, "owned{owner=a} 1\nowned{owner=b} 2\nowned{owner=k} 5\nowned{owner=shared} 100\n"},
		{"sum onto a foreign collector", Sum, true, "owned{owner=a} 1\nowned{owner=b} 2\nowned{owner=k} 5\nowned{owner=shared} 130\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			if tc.foreign {
				reg.MustRegister(&constCollector{desc(), map[string]float64{"k": 5, "shared": 100}})
			}
			a := &constCollector{desc(), map[string]float64{"a": 1, "shared": 10}}
			b := &constCollector{desc(), map[string]float64{"b": 2, "shared": 20}}
			for _, c := range []prometheus.Collector{a, b} {
				if err := tc.join(reg, c); err != nil {
					t.Fatal(err)
				}
			}
			if got := gather(t, reg); got != tc.want {
				t.Errorf("gathered\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
	reg := prometheus.NewRegistry()
	if err := Sum(reg, &constCollector{desc(), nil}); err != nil {
		t.Fatal(err)
	}
	if err := Fan(reg, &constCollector{desc(), nil}); err == nil {
		t.Error("Fan onto collectors registered through Sum succeeded")
	}
	other := prometheus.NewRegistry()
	other.MustRegister(&constCollector{prometheus.NewDesc("owned", "Other help.", []string{"owner"}, nil), nil})
	if err := Sum(other, &constCollector{desc(), nil}); err == nil {
		t.Error("Sum onto a collector of another help succeeded")
	}
}
