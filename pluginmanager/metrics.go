package pluginmanager

import "github.com/prometheus/client_golang/prometheus"

// totalPluginsCollector exports the kubelet's plugin_manager_total_plugins:
// one series per socket path and state, desired_state_of_world for each
// socket found in the directory and actual_state_of_world for each
// registered plugin. Its help is the kubelet's with component-base's
// stability prefix, so that the kubelet's own collector on the same
// registerer is collected with it (promreg.Fan).
type totalPluginsCollector struct {
	m    *Manager
	desc *prometheus.Desc
}

func newTotalPluginsCollector(m *Manager) *totalPluginsCollector {
	return &totalPluginsCollector{m: m, desc: prometheus.NewDesc("plugin_manager_total_plugins",
		"[ALPHA] Number of plugins in Plugin Manager", []string{"socket_path", "state"}, nil)}
}

// Describe implements prometheus.Collector.
func (c *totalPluginsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *totalPluginsCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.RLock()
	defer c.m.mu.RUnlock()
	for path := range c.m.sockets {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, 1, path, "desired_state_of_world")
	}
	for path := range c.m.registered {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, 1, path, "actual_state_of_world")
	}
}
