package reconciler

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodevol/nodevol/internal/promreg"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volumemanager/internal/resolve"
)

// seLinuxMetrics are the kubelet's volume_manager_selinux_* metrics, with
// its names, help, labels and type (gauges it only adds to, named
// *_total). They count from the pod resolutions and the volume
// admissions, as the kubelet counts from its populator:
//
//   - container_{errors,warnings}_total{access_mode}: a container's
//     seLinuxOptions make no label, at each resolution of the pod;
//   - pod_context_mismatch_{errors,warnings}_total{access_mode}: the
//     containers that mount a volume have different labels, at each
//     resolution of the pod;
//   - volume_context_mismatch_{errors,warnings}_total{volume_plugin,
//     access_mode}: a pod would mount a volume with another context than
//     the pods that use it, once each time a pod's refusal for it starts
//     or changes (the kubelet counts each attempt of its populator, which
//     retries the pod at each of its syncs);
//   - volumes_admitted_total{volume_plugin, access_mode}: a volume enters
//     the desired state with a pod that has a label its plugin would mount
//     it with (an inline CSI volume of such a driver too, though it is
//     never mounted with a context). Pods refused the volume stay in
//     nodevol's desired state, so a volume handed over from its pods to a
//     waiting one is not counted again; the kubelet, which keeps them out
//     of its own, counts it again then.
//
// An error is a pod that waits, for a PV; a warning is the same on an
// inline volume, which is not mounted with a context and is not held up.
// In 1.37 a volume_context_mismatch warning cannot happen: an inline
// volume belongs to one pod.
type seLinuxMetrics struct {
	containerErrors, containerWarnings           gaugeVec
	podMismatchErrors, podMismatchWarnings       gaugeVec
	volumeMismatchErrors, volumeMismatchWarnings gaugeVec
	admitted                                     gaugeVec
}

// gaugeVec is a gauge vector: prometheus's own, or one that wraps it (the
// kubelet's k8s.io/component-base GaugeVec).
type gaugeVec interface {
	prometheus.Collector
	GetMetricWithLabelValues(lvs ...string) (prometheus.Gauge, error)
}

func newSELinuxMetrics(reg prometheus.Registerer) (*seLinuxMetrics, error) {
	const (
		mode    = "access_mode"
		plugin  = "volume_plugin"
		later   = " They are not errors yet, but they will become real errors when SELinuxMountReadWriteOncePod feature is expanded to all volume access modes."
		retries = " Kubelet can't start such a Pod then and it will retry, therefore value of this metric may not represent the actual nr. of "
	)
	podMismatch := "Number of errors when a Pod defines different SELinux contexts for its containers that use the same volume."
	volMismatch := "Number of errors when a Pod uses a volume that is already mounted with a different SELinux context than the Pod needs."
	m := &seLinuxMetrics{}
	for _, g := range []struct {
		into   *gaugeVec
		name   string
		help   string
		labels []string
	}{
		{&m.containerErrors, "volume_manager_selinux_container_errors_total",
			"Number of errors when kubelet cannot compute SELinux context for a container." + retries + "containers.", []string{mode}},
		{&m.containerWarnings, "volume_manager_selinux_container_warnings_total",
			"Number of errors when kubelet cannot compute SELinux context for a container that are ignored." +
				" They will become real errors when SELinuxMountReadWriteOncePod feature is expanded to all volume access modes.", []string{mode}},
		{&m.podMismatchErrors, "volume_manager_selinux_pod_context_mismatch_errors_total", podMismatch + retries + "Pods.", []string{mode}},
		{&m.podMismatchWarnings, "volume_manager_selinux_pod_context_mismatch_warnings_total", podMismatch + later, []string{mode}},
		{&m.volumeMismatchErrors, "volume_manager_selinux_volume_context_mismatch_errors_total", volMismatch + retries + "Pods.", []string{plugin, mode}},
		{&m.volumeMismatchWarnings, "volume_manager_selinux_volume_context_mismatch_warnings_total", volMismatch + later, []string{plugin, mode}},
		{&m.admitted, "volume_manager_selinux_volumes_admitted_total",
			"Number of volumes whose SELinux context was fine and will be mounted with mount -o context option.", []string{plugin, mode}},
	} {
		// component-base prefixes the stability level to the help: the
		// kubelet's exact descriptors, so that a registerer holding them
		// (or another manager's) shares them.
		v, err := promreg.Reuse[gaugeVec](reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: g.name, Help: "[ALPHA] " + g.help}, g.labels))
		if err != nil {
			return nil, fmt.Errorf("registering %s: %w", g.name, err)
		}
		*g.into = v
	}
	return m, nil
}

// add adds one to the series of vec with labels lvs.
func add(vec gaugeVec, lvs ...string) {
	if g, err := vec.GetMetricWithLabelValues(lvs...); err == nil {
		g.Add(1)
	}
}

// SELinuxProblem counts a pod volume whose containers give it no label:
// an error when the pod waits for it (failed), else a warning.
func (m *Metrics) SELinuxProblem(p resolve.SELinuxProblem, failed bool, accessMode string) {
	if m == nil || m.seLinux == nil {
		return
	}
	s := m.seLinux
	switch {
	case p == resolve.SELinuxBadOptions && failed:
		add(s.containerErrors, accessMode)
	case p == resolve.SELinuxBadOptions:
		add(s.containerWarnings, accessMode)
	case p == resolve.SELinuxContainersDisagree && failed:
		add(s.podMismatchErrors, accessMode)
	case p == resolve.SELinuxContainersDisagree:
		add(s.podMismatchWarnings, accessMode)
	}
}

// seLinuxConflict counts a pod refused a volume for its SELinux context:
// an error, the pod waits (a PV's; an inline volume has one pod).
func (m *Metrics) seLinuxConflict(spec *podvol.VolumeSpec) {
	if m == nil || m.seLinux == nil {
		return
	}
	add(m.seLinux.volumeMismatchErrors, resolve.SELinuxPluginLabel(spec), resolve.AccessModeLabel(spec))
}

// seLinuxAdmitted counts a volume that entered the desired state with a
// label its plugin would mount it with.
func (m *Metrics) seLinuxAdmitted(spec *podvol.VolumeSpec) {
	if m == nil || m.seLinux == nil {
		return
	}
	add(m.seLinux.admitted, resolve.SELinuxPluginLabel(spec), resolve.AccessModeLabel(spec))
}
