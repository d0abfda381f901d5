package volumemanager

import (
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	oe "github.com/nodevol/nodevol/internal/operationexecutor"
	"github.com/nodevol/nodevol/internal/promreg"
)

// metrics are the kubelet's where one exists. A nil *metrics records nothing.
type metrics struct {
	opDuration observerVec
	// reconstruct counts the volumes reconstructed at start (kubeletmetrics.go).
	reconstruct *reconstructMetrics
	// seLinux are the volume_manager_selinux_* metrics (selinuxmetrics.go).
	seLinux *seLinuxMetrics
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	// The kubelet's exact shape, help text included (k8s.io/component-base
	// prefixes its stability level): a registerer that already holds the
	// kubelet's own collector, or another manager's, shares it.
	var err error
	m := &metrics{}
	m.opDuration, err = promreg.Reuse[observerVec](reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "storage_operation_duration_seconds",
		Help:    "[ALPHA] Storage operation duration",
		Buckets: []float64{.1, .25, .5, 1, 2.5, 5, 10, 15, 25, 50, 120, 300, 600},
	}, []string{"volume_plugin", "operation_name", "status", "migrated"}))
	if err != nil {
		return nil, fmt.Errorf("registering storage_operation_duration_seconds: %w", err)
	}
	if m.reconstruct, err = newReconstructMetrics(reg); err != nil {
		return nil, err
	}
	if m.seLinux, err = newSELinuxMetrics(reg); err != nil {
		return nil, err
	}
	return m, nil
}

// observerVec is a histogram vector: prometheus's own, or one that wraps
// it (the kubelet's k8s.io/component-base HistogramVec).
type observerVec interface {
	prometheus.Collector
	GetMetricWithLabelValues(lvs ...string) (prometheus.Observer, error)
}

func (m *metrics) observe(o oe.Outcome) {
	if m == nil {
		return
	}
	status := "success"
	if o.Err != nil {
		status = "fail-unknown"
	}
	h, err := m.opDuration.GetMetricWithLabelValues(pluginLabel(&o.Spec), o.Action.Kind.NameFor(o.Spec.Mode), status, strconv.FormatBool(o.Spec.MigratedFrom != ""))
	if err != nil {
		return // four label values, always: cannot happen
	}
	h.Observe(o.Duration.Seconds())
}
