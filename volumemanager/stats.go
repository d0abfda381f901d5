package volumemanager

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volumemanager/internal/state"
)

// GetVolumeStats returns the usage of each mounted volume of the pod whose
// plugin reports it, by the pod's volume name: the kinds the kubelet
// measures, each as it does (a CSI volume's NodeGetVolumeStats, with the
// volume's condition for drivers with VOLUME_CONDITION; a du walk of an
// emptyDir, and of a configMap, secret, downwardAPI or projected volume,
// kept until the volume is written again; statfs of a local PV). A volume
// that turns abnormal gets a VolumeConditionAbnormal event on the pod
// (with an EventRecorder), once. The error joins the failures; volumes of
// drivers without GET_VOLUME_STATS, and of plugins that report no usage
// (hostPath, image, as the kubelet's), are left out.
func (vm *VolumeManager) GetVolumeStats(ctx context.Context, uid types.UID) (map[string]volume.Stats, error) {
	out := map[string]volume.Stats{}
	var errs []error
	for _, mv := range vm.asw.PodVolumes(uid) {
		names, s, ok, err := vm.podVolumeStats(ctx, uid, mv)
		switch {
		case err != nil:
			errs = append(errs, err)
		case ok:
			for _, n := range names {
				out[n] = s
			}
		}
	}
	return out, errors.Join(errs...)
}

// GetVolumeStatsFor is GetVolumeStats for one volume of the pod, named as
// in pod.spec.volumes: a kubelet fork's mounter answers its GetMetrics
// with it, one volume at a time. ok is false when the volume is not
// mounted or its plugin reports no usage.
func (vm *VolumeManager) GetVolumeStatsFor(ctx context.Context, uid types.UID, specName string) (s volume.Stats, ok bool, err error) {
	for _, mv := range vm.asw.PodVolumes(uid) {
		if mv.SpecName != specName && !slices.ContainsFunc(vm.dsw.SpecNames(uid, mv.Name), func(n state.SpecName) bool { return n.Name == specName }) {
			continue
		}
		_, s, ok, err = vm.podVolumeStats(ctx, uid, mv)
		return s, ok, err
	}
	return volume.Stats{}, false, nil
}

// podVolumeStats asks the plugin of one mounted volume of the pod for its
// usage, and returns it with the names the pod has for the volume (asked
// once per volume, given under each name; the name it was mounted under
// when it has none). ok is false for a volume not mounted or a plugin
// without usage to report.
func (vm *VolumeManager) podVolumeStats(ctx context.Context, uid types.UID, mv podvol.MountedVolume) (names []string, s volume.Stats, ok bool, err error) {
	if mv.State != podvol.Mounted {
		return nil, s, false, nil
	}
	v, found := vm.asw.Volume(mv.Name)
	if !found {
		return nil, s, false, nil
	}
	p, err := vm.volumes.ForVolume(mv.Name)
	sp, isStats := p.(volume.StatsProvider)
	if err != nil || !isStats {
		return nil, s, false, nil // a plugin without usage to report
	}
	s, ok, err = sp.VolumeStats(ctx, &v.Spec, mv.Path, v.DeviceMountPath)
	if err != nil || !ok {
		return nil, s, false, err
	}
	for _, n := range vm.dsw.SpecNames(uid, mv.Name) {
		names = append(names, n.Name)
	}
	if len(names) == 0 {
		names = []string{mv.SpecName}
	}
	if pm, found := v.Pods[uid]; found {
		vm.conditions.observe(mv.Name, pm.Volume, s.Condition)
		if caps, err := p.Capabilities(&v.Spec); err == nil {
			vm.sizeLimits.observe(ctx, mv.Name, pm.Volume, caps.SizeLimit, s.UsedBytes)
		}
	}
	return names, s, true, nil
}

// volumeStatsCollector exports the kubelet's kubelet_volume_stats_* gauges
// for the mounted volumes of PVCs, of every plugin that reports usage
// (volume.StatsProvider). A volume's stats are asked for at most
// once per period, whatever the scrape rate (kubernetes#103728: a stats
// storm after a restart).
type volumeStatsCollector struct {
	vm     *VolumeManager
	period time.Duration
	descs  [6]*prometheus.Desc
	// health is kubelet_volume_stats_health_status_abnormal (health.go).
	health *prometheus.Desc

	mu    sync.Mutex
	cache map[podvol.UniqueVolumeName]cachedStats
}

type cachedStats struct {
	at    time.Time
	stats volume.Stats
	ok    bool
}

func newVolumeStatsCollector(vm *VolumeManager, period time.Duration) *volumeStatsCollector {
	labels := []string{"namespace", "persistentvolumeclaim"}
	// The kubelet's help, with component-base's stability prefix.
	// health_status_abnormal left the kubelet with 1.37 (volume health is
	// in the pod's status there); it keeps the shape it had.
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("kubelet_volume_stats_"+name, help, labels, nil)
	}
	c := &volumeStatsCollector{vm: vm, period: period, cache: map[podvol.UniqueVolumeName]cachedStats{}, descs: [6]*prometheus.Desc{
		d("capacity_bytes", "[ALPHA] Capacity in bytes of the volume"),
		d("available_bytes", "[ALPHA] Number of available bytes in the volume"),
		d("used_bytes", "[ALPHA] Number of used bytes in the volume"),
		d("inodes", "[ALPHA] Maximum number of inodes in the volume"),
		d("inodes_free", "[ALPHA] Number of free inodes in the volume"),
		d("inodes_used", "[ALPHA] Number of used inodes in the volume"),
	}}
	c.health = d("health_status_abnormal", "[ALPHA] Abnormal volume health status. The count is either 1 or 0. 1 indicates the volume is unhealthy, 0 indicates volume is healthy")
	return c
}

// Describe implements prometheus.Collector.
func (c *volumeStatsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
	ch <- c.health
}

// Collect implements prometheus.Collector.
func (c *volumeStatsCollector) Collect(ch chan<- prometheus.Metric) {
	vm := c.vm
	ctx, cancel := context.WithTimeout(vm.context(), 30*time.Second)
	defer cancel()
	now := vm.cfg.Clock.Now()
	seen := map[podvol.UniqueVolumeName]bool{}
	for _, name := range vm.asw.VolumeNames() {
		v, ok := vm.asw.Volume(name)
		if !ok || v.Spec.PVName == "" {
			continue
		}
		pv, err := vm.resolver.PVs.Get(v.Spec.PVName)
		if err != nil || pv.Spec.ClaimRef == nil {
			continue
		}
		var path string
		var mounted []podvol.PodVolume
		for _, pm := range v.Pods {
			if pm.State == podvol.Mounted {
				if path == "" {
					path = pm.Path
				}
				mounted = append(mounted, pm.Volume)
			}
		}
		if path == "" {
			continue
		}
		seen[name] = true
		s := c.get(ctx, now, name, &v.Spec, path, v.DeviceMountPath)
		if !s.ok {
			continue
		}
		ns, claim := pv.Spec.ClaimRef.Namespace, pv.Spec.ClaimRef.Name
		for i, val := range []int64{s.stats.CapacityBytes, s.stats.AvailableBytes, s.stats.UsedBytes, s.stats.Inodes, s.stats.InodesFree, s.stats.InodesUsed} {
			if val >= 0 {
				ch <- prometheus.MustNewConstMetric(c.descs[i], prometheus.GaugeValue, float64(val), ns, claim)
			}
		}
		if cond := s.stats.Condition; cond != nil {
			abnormal := 0.0
			if cond.Abnormal {
				abnormal = 1
			}
			ch <- prometheus.MustNewConstMetric(c.health, prometheus.GaugeValue, abnormal, ns, claim)
			for _, pv := range mounted {
				vm.conditions.observe(name, pv, cond)
			}
		}
	}
	vm.conditions.forgetGone(vm.asw)
	c.mu.Lock()
	for name := range c.cache {
		if !seen[name] {
			delete(c.cache, name)
		}
	}
	c.mu.Unlock()
}

// get returns the cached stats of a volume, asking its plugin when they
// are older than the period; not ok when the plugin reports no usage.
func (c *volumeStatsCollector) get(ctx context.Context, now time.Time, name podvol.UniqueVolumeName, spec *podvol.VolumeSpec, path, staging string) cachedStats {
	c.mu.Lock()
	s, ok := c.cache[name]
	c.mu.Unlock()
	if ok && now.Sub(s.at) < c.period {
		return s
	}
	var stats volume.Stats
	has := false
	p, err := c.vm.volumes.ForVolume(name)
	if sp, ok := p.(volume.StatsProvider); ok && err == nil {
		stats, has, err = sp.VolumeStats(ctx, spec, path, staging)
	}
	if err != nil {
		klog.FromContext(ctx).V(2).Info("Volume stats unavailable", "volume", name, "err", err)
	}
	s = cachedStats{at: now, stats: stats, ok: has && err == nil}
	c.mu.Lock()
	c.cache[name] = s
	c.mu.Unlock()
	return s
}
