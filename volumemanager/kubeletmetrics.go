package volumemanager

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodevol/nodevol/internal/promreg"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volumemanager/internal/reconciler"
	"github.com/nodevol/nodevol/volumemanager/internal/state"
)

// The kubelet's volume_manager_total_volumes, beside the loop's metrics
// (internal/reconciler/metrics.go: storage_operation_duration_seconds and
// the reconstruction counters): its volume counts by state.
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
			counts[key{reconciler.PluginLabel(&spec), stateDesired}] += len(pods)
		}
	}
	for _, name := range c.asw.VolumeNames() {
		v, ok := c.asw.Volume(name)
		if !ok {
			continue
		}
		for _, pm := range v.Pods {
			if pm.State == podvol.Mounted {
				counts[key{reconciler.PluginLabel(&v.Spec), stateActual}]++
			}
		}
	}
	for k, n := range counts {
		if n > 0 {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), k.plugin, k.state)
		}
	}
}
