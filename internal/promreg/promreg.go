// Package promreg registers Prometheus collectors on a registerer that may
// already hold identical ones: a second nodevol manager on the same
// registerer, or a kubelet fork that has registered the kubelet's own
// metrics of the same name and shape. prometheus.Registerer.Register
// refuses a second identical collector (AlreadyRegisteredError); these
// helpers reuse or extend the one already there instead.
package promreg

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Reuse registers c on reg and returns it, or, when reg already holds a
// collector with the same descriptors (same names, label names and help),
// returns that one so that both owners count into the same families. T is
// usually an interface (an observer vector, a counter), so that the
// existing collector may be of another type than c, such as the kubelet's
// k8s.io/component-base wrappers. An existing collector that is not a T is
// an error naming both types.
func Reuse[T prometheus.Collector](reg prometheus.Registerer, c T) (T, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if !errors.As(err, &are) {
		return c, err
	}
	existing, ok := are.ExistingCollector.(T)
	if !ok {
		var zero T
		return zero, fmt.Errorf("a collector of the same metrics is already registered, a %T, which cannot be used as a %T: %w", are.ExistingCollector, c, err)
	}
	return existing, nil
}

// Fan registers c, a collector of one owner's state (one manager's
// volumes), on reg. When reg already holds a collector with the same
// descriptors, c is added to it (see join): a gather then collects from
// every owner's collector, and reports a series that several report with
// the same name and labels once, the first owner's, because a registry
// refuses duplicate series.
func Fan(reg prometheus.Registerer, c prometheus.Collector) error {
	return join(reg, c, false)
}

// Sum is Fan for collectors of gauges or counters that count parts of one
// whole (each manager's volumes by plugin and state): a series that
// several owners report is reported once, with the sum of their values.
func Sum(reg prometheus.Registerer, c prometheus.Collector) error {
	return join(reg, c, true)
}

// join registers c on reg inside a fan, or adds it to the fan of the same
// descriptors already there. A collector of the same descriptors
// registered otherwise (the kubelet's own, k8s.io/component-base's custom
// collectors, on the registerer a kubelet fork passes) is taken into a new
// fan as its first part: it is unregistered and the fan registered in its
// place, so that its series are still gathered, with c's beside them.
func join(reg prometheus.Registerer, c prometheus.Collector, sum bool) error {
	f := &fan{parts: []prometheus.Collector{c}, sum: sum}
	err := reg.Register(f)
	if err == nil {
		return nil
	}
	var are prometheus.AlreadyRegisteredError
	if !errors.As(err, &are) {
		return err
	}
	existing := are.ExistingCollector
	if e, ok := existing.(*fan); ok {
		if e.sum != sum {
			return fmt.Errorf("the same metrics are already registered to be %s: %w", e.mode(), err)
		}
		e.add(c)
		return nil
	}
	if !reg.Unregister(existing) {
		return fmt.Errorf("a %T collecting the same metrics is registered and cannot be unregistered: %w", existing, err)
	}
	f.parts = []prometheus.Collector{existing, c}
	if err := reg.Register(f); err != nil {
		// Put the owner's collector back as it was.
		return errors.Join(fmt.Errorf("collecting the metrics of a %T with another owner's: %w", existing, err), reg.Register(existing))
	}
	return nil
}

// fan is one registered collector over several owners' collectors of the
// same descriptors.
type fan struct {
	mu    sync.Mutex
	parts []prometheus.Collector
	// sum: a series several parts report is reported with the sum of
	// their values, not the first part's.
	sum bool
}

func (f *fan) mode() string {
	if f.sum {
		return "summed"
	}
	return "collected from the first owner that reports a series"
}

func (f *fan) add(c prometheus.Collector) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range f.parts {
		if p == c { // the registration that created f
			return
		}
	}
	f.parts = append(f.parts, c)
}

func (f *fan) snapshot() []prometheus.Collector {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]prometheus.Collector(nil), f.parts...)
}

// Describe implements prometheus.Collector: every part has the same
// descriptors, the first part's.
func (f *fan) Describe(ch chan<- *prometheus.Desc) { f.snapshot()[0].Describe(ch) }

// Collect implements prometheus.Collector.
func (f *fan) Collect(ch chan<- prometheus.Metric) {
	var order []string
	series := map[string]prometheus.Metric{}
	for _, p := range f.snapshot() {
		in := make(chan prometheus.Metric)
		go func() {
			defer close(in)
			p.Collect(in)
		}()
		for m := range in {
			k := seriesKey(m)
			if k == "" {
				ch <- m // the registry reports what is wrong with it
				continue
			}
			prev, seen := series[k]
			switch {
			case !seen:
				order = append(order, k)
				series[k] = m
			case f.sum:
				series[k] = added(prev, m)
			}
		}
	}
	for _, k := range order {
		ch <- series[k]
	}
}

// added returns a with b's value added to it, for a gauge or a counter;
// a, as it is, for another type.
func added(a, b prometheus.Metric) prometheus.Metric {
	var da, db dto.Metric
	if a.Write(&da) != nil || b.Write(&db) != nil {
		return a
	}
	switch {
	case da.Gauge != nil && db.Gauge != nil:
		return sumMetric{Metric: a, value: da.GetGauge().GetValue() + db.GetGauge().GetValue()}
	case da.Counter != nil && db.Counter != nil:
		return sumMetric{Metric: a, value: da.GetCounter().GetValue() + db.GetCounter().GetValue()}
	}
	return a
}

// sumMetric is a gauge or counter series with the values of several
// owners' series added up.
type sumMetric struct {
	prometheus.Metric
	value float64
}

// Write implements prometheus.Metric.
func (s sumMetric) Write(out *dto.Metric) error {
	if err := s.Metric.Write(out); err != nil {
		return err
	}
	v := s.value
	if out.Gauge != nil {
		out.Gauge.Value = &v
	}
	if out.Counter != nil {
		out.Counter.Value = &v
	}
	return nil
}

// seriesKey identifies a metric's series by its descriptor and label
// values; "" when the metric cannot be read (it is then passed on, and
// the registry reports what is wrong with it).
func seriesKey(m prometheus.Metric) string {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		return ""
	}
	var b strings.Builder
	b.WriteString(m.Desc().String())
	for _, l := range d.GetLabel() {
		b.WriteString("\x00" + l.GetName() + "=" + l.GetValue())
	}
	return b.String()
}
