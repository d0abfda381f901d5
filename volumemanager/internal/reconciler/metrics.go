package reconciler

import (
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodevol/nodevol/internal/promreg"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
)

// Metrics are the loop's counts, the kubelet's's where one exists. A nil *Metrics records nothing.
type Metrics struct {
	opDuration observerVec
	// endToEnd is volume_operation_total_seconds: how long a pod volume
	// took from entering the desired state to its first successful
	// publish (overall_volume_mount).
	endToEnd observerVec
	// reconstruct counts the volumes reconstructed at start (below).
	reconstruct *reconstructMetrics
	// seLinux are the volume_manager_selinux_* metrics (selinuxmetrics.go).
	seLinux *seLinuxMetrics
}

// NewMetrics registers the metrics with reg; nil reg: nil, nothing is
// recorded.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		return nil, nil
	}
	// The kubelet's exact shape, help text included (k8s.io/component-base
	// prefixes its stability level, BETA for both since Kubernetes 1.37): a
	// registerer that already holds the kubelet's own collector, or another
	// manager's, shares it.
	buckets := []float64{.1, .25, .5, 1, 2.5, 5, 10, 15, 25, 50, 120, 300, 600}
	m := &Metrics{}
	for _, h := range []struct {
		into       *observerVec
		name, help string
		labels     []string
	}{
		{&m.opDuration, "storage_operation_duration_seconds", "[BETA] Storage operation duration",
			[]string{"volume_plugin", "operation_name", "status", "migrated"}},
		{&m.endToEnd, "volume_operation_total_seconds", "[BETA] Storage operation end to end duration in seconds",
			[]string{"plugin_name", "operation_name"}},
	} {
		v, err := promreg.Reuse[observerVec](reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: h.name, Help: h.help, Buckets: buckets,
		}, h.labels))
		if err != nil {
			return nil, fmt.Errorf("registering %s: %w", h.name, err)
		}
		*h.into = v
	}
	var err error
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

func (m *Metrics) observe(o oe.Outcome) {
	if m == nil {
		return
	}
	status := "success"
	if o.Err != nil {
		status = "fail-unknown"
	}
	name := o.Action.Kind.NameFor(o.Spec.Mode)
	if o.Action.Kind == oe.OpStage {
		// The kubelet stages inside its volume_mount (map_volume)
		// operation and records no series of its own for it: a failed
		// stage is a failed mount; a stage that succeeded is part of
		// the mount the publish records.
		if o.Err == nil {
			return
		}
		name = oe.OpPublish.NameFor(o.Spec.Mode)
	}
	m.record(&o.Spec, name, status, o.Duration)
}

// record adds one sample to storage_operation_duration_seconds.
func (m *Metrics) record(spec *podvol.VolumeSpec, operation, status string, took time.Duration) {
	h, err := m.opDuration.GetMetricWithLabelValues(PluginLabel(spec), operation, status, strconv.FormatBool(spec.MigratedFrom != ""))
	if err != nil {
		return // four label values, always: cannot happen
	}
	h.Observe(took.Seconds())
}

// AccessControl records the kubelet's volume_apply_access_control: an
// ownership change of a volume to its pod's fsGroup that ran (a walk, or
// the atomic writer's write that gives the group), as the kubelet records
// each walk (never one of migrated volume: its hook has no such label).
func (m *Metrics) AccessControl(spec *podvol.VolumeSpec, took time.Duration, err error) {
	status := "success"
	if err != nil {
		status = "fail-unknown"
	}
	if h, err := m.opDuration.GetMetricWithLabelValues(PluginLabel(spec), "volume_apply_access_control", status, "false"); err == nil {
		h.Observe(took.Seconds())
	}
}

// attachmentNotNeeded records the kubelet's verify_controller_attached_volume
// of a volume that needs no attachment as it enters the actual state: the
// kubelet runs that operation for every volume, and for one that is not
// attachable it only marks it attached, at once. (An attachable volume's
// is nodevol's OpAttach, recorded by observe.)
func (m *Metrics) attachmentNotNeeded(spec *podvol.VolumeSpec) {
	if m == nil {
		return
	}
	m.record(spec, oe.OpAttach.String(), "success", 0)
}

// mounted records a pod volume's end to end mount time, as the kubelet's
// overall_volume_mount: the time since it entered the desired state for a
// first mount (or a mount again after an uncertain one). The kubelet
// counts a remount of a Mounted volume too (a republish), timed from its
// last populator pass, which stamps such volumes anew each time: the
// publish's own duration stands for that here.
func (m *Metrics) mounted(spec *podvol.VolumeSpec, took time.Duration) {
	if m == nil {
		return
	}
	if h, err := m.endToEnd.GetMetricWithLabelValues(PluginLabel(spec), "overall_volume_mount"); err == nil {
		h.Observe(took.Seconds())
	}
}

// reconstructMetrics are the kubelet's counters of the volumes reconstructed
// from disk at start.
type reconstructMetrics struct {
	total, errors adder
}

// adder is a counter: prometheus's own, or one that wraps it (the
// kubelet's k8s.io/component-base Counter).
type adder interface {
	prometheus.Collector
	Add(float64)
}

func newReconstructMetrics(reg prometheus.Registerer) (*reconstructMetrics, error) {
	total, errs := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "reconstruct_volume_operations_total",
		Help: "[ALPHA] The number of volumes that were attempted to be reconstructed from the operating system during kubelet startup. This includes both successful and failed reconstruction.",
	}), prometheus.NewCounter(prometheus.CounterOpts{
		Name: "reconstruct_volume_operations_errors_total",
		Help: "[ALPHA] The number of volumes that failed reconstruction from the operating system during kubelet startup.",
	})
	// The kubelet's help, with component-base's stability prefix: shared
	// with the kubelet's counters on reg, or another manager's.
	var err error
	m := &reconstructMetrics{}
	if m.total, err = promreg.Reuse[adder](reg, total); err != nil {
		return nil, fmt.Errorf("registering reconstruct_volume_operations_total: %w", err)
	}
	if m.errors, err = promreg.Reuse[adder](reg, errs); err != nil {
		return nil, fmt.Errorf("registering reconstruct_volume_operations_errors_total: %w", err)
	}
	return m, nil
}

// reconstructed records what reconstruction found: the pod volumes it
// tried, and those it could not reconstruct.
func (m *Metrics) reconstructed(d volume.Found) {
	if m == nil || m.reconstruct == nil {
		return
	}
	m.reconstruct.total.Add(float64(d.Attempted))
	m.reconstruct.errors.Add(float64(len(d.Unreadable)))
}

// PluginLabel is the kubelet's plugin label of a volume
// (GetFullQualifiedPluginNameForVolume): "kubernetes.io/csi:{driver}" for
// a CSI volume, the plugin's name for another.
func PluginLabel(spec *podvol.VolumeSpec) string {
	if spec.Plugin != "" {
		return spec.Plugin
	}
	return podvol.CSIPluginName + ":" + spec.Driver
}
