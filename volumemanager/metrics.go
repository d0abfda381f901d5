package volumemanager

import (
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodevol/nodevol/internal/promreg"
	"github.com/nodevol/nodevol/podvol"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
)

// metrics are the kubelet's where one exists. A nil *metrics records nothing.
type metrics struct {
	opDuration observerVec
	// endToEnd is volume_operation_total_seconds: how long a pod volume
	// took from entering the desired state to its first successful
	// publish (overall_volume_mount).
	endToEnd observerVec
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
	// prefixes its stability level, BETA for both since Kubernetes 1.37): a
	// registerer that already holds the kubelet's own collector, or another
	// manager's, shares it.
	buckets := []float64{.1, .25, .5, 1, 2.5, 5, 10, 15, 25, 50, 120, 300, 600}
	m := &metrics{}
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

func (m *metrics) observe(o oe.Outcome) {
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
func (m *metrics) record(spec *podvol.VolumeSpec, operation, status string, took time.Duration) {
	h, err := m.opDuration.GetMetricWithLabelValues(pluginLabel(spec), operation, status, strconv.FormatBool(spec.MigratedFrom != ""))
	if err != nil {
		return // four label values, always: cannot happen
	}
	h.Observe(took.Seconds())
}

// accessControl records the kubelet's volume_apply_access_control: an
// ownership change of a volume to its pod's fsGroup that ran (a walk, or
// the atomic writer's write that gives the group), as the kubelet records
// each walk (never one of migrated volume: its hook has no such label).
func (m *metrics) accessControl(spec *podvol.VolumeSpec, took time.Duration, err error) {
	status := "success"
	if err != nil {
		status = "fail-unknown"
	}
	if h, err := m.opDuration.GetMetricWithLabelValues(pluginLabel(spec), "volume_apply_access_control", status, "false"); err == nil {
		h.Observe(took.Seconds())
	}
}

// attachmentNotNeeded records the kubelet's verify_controller_attached_volume
// of a volume that needs no attachment as it enters the actual state: the
// kubelet runs that operation for every volume, and for one that is not
// attachable it only marks it attached, at once. (An attachable volume's
// is nodevol's OpAttach, recorded by observe.)
func (m *metrics) attachmentNotNeeded(spec *podvol.VolumeSpec) {
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
func (m *metrics) mounted(spec *podvol.VolumeSpec, took time.Duration) {
	if m == nil {
		return
	}
	if h, err := m.endToEnd.GetMetricWithLabelValues(pluginLabel(spec), "overall_volume_mount"); err == nil {
		h.Observe(took.Seconds())
	}
}
