package volumemanager

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodevol/nodevol/internal/promreg"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volumemanager/internal/state"
)

// The kubelet's volume manager metrics beside storage_operation_duration_seconds
// (metrics.go): its volume counts by state, and its reconstruction counters.
const (
	stateDesired = "desired_state_of_world"
	stateActual  = "actual_state_of_world"
)

// totalVolumesCollector exports volume_manager_total_volumes{plugin_name,
// state}, as the kubelet counts it: a (pod, volume) pair per pod that wants
// a volume (desired_state_of_world) and per pod that has it Mounted
// (actual_state_of_world; Uncertain mounts are not counted), by the fully
// qualified plugin name "kubernetes.io/csi:{driver}". Managers that share
// a registerer, and the kubelet's own collector there, are summed
// (promreg.Sum).
type totalVolumesCollector struct {
	desc *prometheus.Desc
	dsw  *state.DesiredStateOfWorld
	asw  *state.ActualStateOfWorld
}

// registerTotalVolumes registers the volume counts of dsw and asw on reg,
// added to those of the collectors of the family already there.
func registerTotalVolumes(reg prometheus.Registerer, dsw *state.DesiredStateOfWorld, asw *state.ActualStateOfWorld) error {
	// The kubelet's help, with component-base's stability prefix.
	return promreg.Sum(reg, &totalVolumesCollector{dsw: dsw, asw: asw, desc: prometheus.NewDesc("volume_manager_total_volumes",
		"[ALPHA] Number of volumes in Volume Manager", []string{"plugin_name", "state"}, nil)})
}

// Describe implements prometheus.Collector.
func (c *totalVolumesCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *totalVolumesCollector) Collect(ch chan<- prometheus.Metric) {
	type key struct{ plugin, state string }
	counts := map[key]int{}
	for _, name := range c.dsw.VolumeNames() {
		if spec, pods, ok := c.dsw.Volume(name); ok {
			counts[key{pluginLabel(&spec), stateDesired}] += len(pods)
		}
	}
	for _, name := range c.asw.VolumeNames() {
		v, ok := c.asw.Volume(name)
		if !ok {
			continue
		}
		for _, pm := range v.Pods {
			if pm.State == podvol.Mounted {
				counts[key{pluginLabel(&v.Spec), stateActual}]++
			}
		}
	}
	for k, n := range counts {
		if n > 0 {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), k.plugin, k.state)
		}
	}
}

// pluginLabel is the kubelet's plugin label of a volume
// (GetFullQualifiedPluginNameForVolume): "kubernetes.io/csi:{driver}" for
// a CSI volume, the plugin's name for another.
func pluginLabel(spec *podvol.VolumeSpec) string {
	if spec.Plugin != "" {
		return spec.Plugin
	}
	return podvol.CSIPluginName + ":" + spec.Driver
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
func (m *metrics) reconstructed(d volume.Found) {
	if m == nil || m.reconstruct == nil {
		return
	}
	m.reconstruct.total.Add(float64(d.Attempted))
	m.reconstruct.errors.Add(float64(len(d.Unreadable)))
}
