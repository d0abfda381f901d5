package volumemanager

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/nodevol/nodevol/internal/promreg"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
	"github.com/nodevol/nodevol/volumemanager/internal/reconciler"
	"github.com/nodevol/nodevol/volumemanager/internal/state"
)

// SizeLimitConfig says how the manager reports a pod volume whose usage
// exceeds its size limit (an emptyDir over its sizeLimit: the plugin's
// Capabilities.SizeLimit). The kubelet's eviction manager evicts such a
// pod; nodevol evicts nothing: it reports, and the agent decides.
//
// A report is made when a volume is found over its limit after it was not
// (once per crossing, not at every measurement): a Warning event on the
// pod (with an EventRecorder), reason SizeLimitExceeded and the kubelet's
// eviction words without the eviction ("Usage of EmptyDir volume "cache"
// exceeds its sizeLimit "1Mi""); the gauge
// nodevol_volumes_over_size_limit (with a Registerer), the pod volumes
// over their limit now; and OnExceeded, if set. Usage comes from every
// measurement the manager makes (GetVolumeStats, GetVolumeStatsFor, which
// a kubelet fork's stats summary calls every --volume-stats-agg-period),
// and Run measures, every Config.VolumeStatsPeriod, the volumes with a
// limit that nothing measured in the period before: no volume is walked
// more often than that for this report, and a volume without a limit is
// never walked for it.
type SizeLimitConfig struct {
	// Off turns the report off: no event, no gauge, no callback, and
	// Run measures nothing for it. A kubelet fork sets it: the kubelet's
	// eviction manager reads the same usage (GetVolumeStatsFor) and
	// evicts the pod with its own event. Default false: on.
	Off bool
	// OnExceeded, if set, is called with each report, from the goroutine
	// that made the measurement (Run's, or the caller's of
	// GetVolumeStats): it must not block for long. An agent that enforces
	// the limit as the kubelet does evicts the pod here. Default nil.
	OnExceeded func(ctx context.Context, e SizeLimitExceeded)
}

// SizeLimitExceeded is one pod volume found over its size limit.
type SizeLimitExceeded struct {
	// Pod is the pod, Volume its name for the volume (pod.spec.volumes).
	Pod    podvol.PodRef
	Volume string
	// Limit is the volume's size limit, as the pod gives it.
	Limit resource.Quantity
	// UsedBytes is what the measurement found (volume.Stats.UsedBytes).
	UsedBytes int64
}

// reasonSizeLimitExceeded is the reason of the event of a volume over its
// size limit: nodevol's (the kubelet's reason, Evicted, is for what it
// does next, which nodevol does not do).
const reasonSizeLimitExceeded = "SizeLimitExceeded"

// sizeLimits keeps which pod volumes are over their size limit and when
// each volume with a limit was last measured, and makes the reports.
type sizeLimits struct {
	cfg    SizeLimitConfig
	events record.EventRecorder // nil: no events
	gauge  prometheus.Gauge     // nil: no gauge
	clock  clock.Clock
	period time.Duration

	mu sync.Mutex
	// over are the pod volumes found over their limit at their last
	// measurement.
	over map[oe.Key]bool
	// measured is when each pod volume with a limit was last measured.
	measured map[oe.Key]time.Time
}

// newSizeLimits returns the report of cfg.SizeLimit, its gauge registered
// on cfg.Registerer (shared with other managers of the registerer); nil
// when the report is off.
func newSizeLimits(cfg Config) (*sizeLimits, error) {
	if cfg.SizeLimit.Off {
		return nil, nil
	}
	s := &sizeLimits{cfg: cfg.SizeLimit, events: cfg.EventRecorder, clock: cfg.Clock, period: cfg.VolumeStatsPeriod,
		over: map[oe.Key]bool{}, measured: map[oe.Key]time.Time{}}
	if cfg.Registerer != nil {
		g, err := promreg.Reuse(cfg.Registerer, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nodevol_volumes_over_size_limit",
			Help: "Number of pod volumes (emptyDirs) whose usage exceeded their sizeLimit when last measured.",
		}))
		if err != nil {
			return nil, fmt.Errorf("volumemanager: registering nodevol_volumes_over_size_limit: %w", err)
		}
		s.gauge = g
	}
	return s, nil
}

// observe takes one measurement of pod volume vol (volume name) whose
// limit is limit (nil: none), and reports it if it has just gone over.
func (s *sizeLimits) observe(ctx context.Context, name podvol.UniqueVolumeName, vol podvol.PodVolume, limit *resource.Quantity, used int64) {
	if s == nil || limit == nil {
		return
	}
	key := oe.Key{Volume: name, Pod: vol.Pod.UID}
	// As the kubelet compares them: the usage as a quantity of bytes.
	over := limit.Sign() > 0 && resource.NewQuantity(used, resource.BinarySI).Cmp(*limit) > 0
	s.mu.Lock()
	s.measured[key] = s.clock.Now()
	was := s.over[key]
	switch {
	case over && !was:
		s.over[key] = true
	case !over && was:
		delete(s.over, key)
	}
	s.mu.Unlock()
	if over == was {
		return
	}
	if s.gauge != nil {
		if over {
			s.gauge.Inc()
		} else {
			s.gauge.Dec()
		}
	}
	if !over {
		return
	}
	msg := fmt.Sprintf("Usage of EmptyDir volume %q exceeds its sizeLimit %q", vol.SpecName, limit.String())
	klog.FromContext(ctx).Info("Volume over its size limit", "pod", vol.Pod.String(), "volume", vol.SpecName,
		"sizeLimit", limit.String(), "usedBytes", used)
	if s.events != nil && vol.Pod.Name != "" {
		s.events.Event(reconciler.PodObjectRef(vol.Pod), v1.EventTypeWarning, reasonSizeLimitExceeded, msg)
	}
	if s.cfg.OnExceeded != nil {
		s.cfg.OnExceeded(ctx, SizeLimitExceeded{Pod: vol.Pod, Volume: vol.SpecName, Limit: limit.DeepCopy(), UsedBytes: used})
	}
}

// due returns the pods whose volumes with a limit are mounted and were not
// measured in the last period, and forgets the pod volumes no longer
// mounted (the gauge counts them no more).
func (s *sizeLimits) due(asw *state.ActualStateOfWorld, plugins *volume.Registry) map[types.UID][]podvol.UniqueVolumeName {
	now := s.clock.Now()
	out := map[types.UID][]podvol.UniqueVolumeName{}
	mounted := map[oe.Key]bool{}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, name := range asw.VolumeNames() {
		v, ok := asw.Volume(name)
		if !ok {
			continue
		}
		caps, err := capabilitiesOf(plugins, &v.Spec)
		if err != nil || caps.SizeLimit == nil {
			continue
		}
		for uid, pm := range v.Pods {
			if pm.State != podvol.Mounted {
				continue
			}
			key := oe.Key{Volume: name, Pod: uid}
			mounted[key] = true
			if at, ok := s.measured[key]; !ok || now.Sub(at) >= s.period {
				out[uid] = append(out[uid], name)
			}
		}
	}
	for key := range s.measured {
		if !mounted[key] {
			delete(s.measured, key)
		}
	}
	for key := range s.over {
		if !mounted[key] {
			delete(s.over, key)
			if s.gauge != nil {
				s.gauge.Dec()
			}
		}
	}
	return out
}

// runSizeLimits measures, every VolumeStatsPeriod until ctx ends, the
// mounted volumes with a size limit that nothing measured in the period
// before (sizeLimits.due); each measurement reports through observe.
func (vm *VolumeManager) runSizeLimits(ctx context.Context) {
	s := vm.sizeLimits
	for {
		for uid, names := range s.due(vm.asw, vm.volumes) {
			for _, mv := range vm.asw.PodVolumes(uid) {
				if !slices.Contains(names, mv.Name) {
					continue
				}
				if _, _, _, err := vm.podVolumeStats(ctx, uid, mv); err != nil {
					klog.FromContext(ctx).V(2).Info("Volume stats unavailable", "pod", uid, "volume", mv.SpecName, "err", err)
				}
			}
		}
		timer := s.clock.NewTimer(s.period)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C():
		}
	}
}
