package volumemanager

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodevol/nodevol/cache"
	oe "github.com/nodevol/nodevol/operationexecutor"
)

// metrics are the kubelet's where one exists. A nil *metrics records nothing.
type metrics struct {
	opDuration *prometheus.HistogramVec
	// reconstruct counts the volumes reconstructed at start (kubeletmetrics.go).
	reconstruct *reconstructMetrics
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &metrics{
		opDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "storage_operation_duration_seconds",
			Help:    "Storage operation duration, by volume plugin, operation and status.",
			Buckets: []float64{.1, .25, .5, 1, 2.5, 5, 10, 15, 25, 50, 120, 300, 600},
		}, []string{"volume_plugin", "operation_name", "status", "migrated"}),
	}
	if err := reg.Register(m.opDuration); err != nil {
		return nil, err
	}
	var err error
	if m.reconstruct, err = newReconstructMetrics(reg); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *metrics) observe(o oe.Outcome) {
	if m == nil {
		return
	}
	status := "success"
	if o.Err != nil {
		status = "fail-unknown"
	}
	m.opDuration.WithLabelValues(cache.CSIPluginName+":"+o.Spec.Driver, o.Action.Kind.NameFor(o.Spec.Mode), status, strconv.FormatBool(o.Spec.MigratedFrom != "")).Observe(o.Duration.Seconds())
}
