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
// descriptors registered through Fan, c is added to it: a gather then
// collects from every owner's collector, and reports a series that
// several report with the same name and labels once, the first owner's,
// because a registry refuses duplicate series. A collector with the same
// descriptors registered otherwise is an error.
func Fan(reg prometheus.Registerer, c prometheus.Collector) error {
	f, err := Reuse[*fan](reg, &fan{parts: []prometheus.Collector{c}})
	if err != nil {
		return err
	}
	f.add(c)
	return nil
}

// fan is one registered collector over several owners' collectors of the
// same descriptors.
type fan struct {
	mu    sync.Mutex
	parts []prometheus.Collector
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
	seen := map[string]bool{}
	for _, p := range f.snapshot() {
		in := make(chan prometheus.Metric)
		go func() {
			defer close(in)
			p.Collect(in)
		}()
		for m := range in {
			k := seriesKey(m)
			if k != "" && seen[k] {
				continue
			}
			seen[k] = true
			ch <- m
		}
	}
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
