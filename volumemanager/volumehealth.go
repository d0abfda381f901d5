package volumemanager

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/nodevol/nodevol/csi"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/internal/promreg"
	"github.com/nodevol/nodevol/podvol"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
	"github.com/nodevol/nodevol/volumemanager/internal/state"
	"github.com/nodevol/nodevol/volumemanager/internal/storagehealth"
)

// VolumeHealthConfig turns on the health probes of CSI 1.13 (the kubelet's
// CSIVolumeHealth feature, alpha in 1.37 and off by default there):
// NodeGetVolumeHealth for the pods' CSI volumes, given to Updater, and
// NodeGetStorageHealth for every registered driver, written into the
// CSINode's status.storageHealth.
type VolumeHealthConfig struct {
	// ProbeInterval is the wait between the end of one probe round and
	// the start of the next; the first round runs when Run starts.
	// Default Config.VolumeStatsPeriod (1 minute), as the kubelet probes
	// at its --volume-stats-agg-period.
	ProbeInterval time.Duration
	// Updater receives each pod volume's health (the kubelet's status
	// manager, which writes pod status.volumeHealth). Default nil:
	// NodeGetVolumeHealth is not called.
	Updater VolumeHealthUpdater
	// NoStorageHealth, when true, leaves NodeGetStorageHealth uncalled
	// and the CSINode's status alone: for credentials that may not
	// update csinodes/status (see storagehealth.Update).
	// Default false.
	NoStorageHealth bool
}

// VolumeHealthUpdater is told the health of pods' CSI volumes. A node
// agent implements it; a kubelet fork hands it its status manager.
type VolumeHealthUpdater interface {
	// SetPodVolumeHealth says that the pod's volume volumeName (its name
	// in pod.spec.volumes) has these adverse conditions now; none: it is
	// healthy. It is called when the set of (status, reason) changes from
	// what it was last told for that pod volume (the kubelet's status
	// manager skips the same calls; a message that changes alone is not
	// passed on), starting from none: a volume that is healthy from the
	// first probe is never mentioned. An error makes the same call come
	// again at the next probe. It must not block for long: probes wait.
	SetPodVolumeHealth(ctx context.Context, pod podvol.PodRef, volumeName string, conditions []v1.VolumeHealthCondition) error
}

// healthProber runs the probe rounds. Volumes are probed when a pod that
// still wants them has them mounted (or maybe mounted), or when their
// stage or publish for that pod was attempted, as the kubelet's
// GetVolumesToReportHealth chooses them: the CSI spec lets a driver
// report why a stage or publish fails.
type healthProber struct {
	cfg     VolumeHealthConfig
	clock   clock.Clock
	drivers *csi.Registry
	client  kubernetes.Interface
	node    string
	rootDir string
	dsw     *state.DesiredStateOfWorld
	asw     *state.ActualStateOfWorld
	gauge   *storageHealthGauge // nil without a Registerer
	// rounds counts the rounds done; the timer for the next is set first.
	rounds atomic.Int64

	mu sync.Mutex
	// attempted are the pod volumes whose stage or publish the loop
	// started (attempt); forgotten once their pod no longer wants them.
	attempted map[oe.Key]bool

	// storage is the storage health last written (or found written) in
	// the CSINode, by driver; forgotten when the driver registers again
	// (registration rewrites its CSINode entry, and the CSINode may be
	// new), so that the next round reads the CSINode again.
	storage map[string][]storagev1.StorageHealthCondition

	// The rest belongs to the probe round (one at a time).
	// reported is what Updater was last told of each pod volume.
	reported map[oe.Key][]v1.VolumeHealthCondition
	// volumeErrs and storageErrs are the errors last logged, so that an
	// error is logged once per change, not at every round.
	volumeErrs  map[oe.Key]string
	storageErrs map[string]string
}

// newHealthProber returns the prober of cfg.VolumeHealth, its interval
// defaulted.
func newHealthProber(cfg Config, gauge *storageHealthGauge, dsw *state.DesiredStateOfWorld, asw *state.ActualStateOfWorld) *healthProber {
	hc := *cfg.VolumeHealth
	if hc.ProbeInterval <= 0 {
		hc.ProbeInterval = cfg.VolumeStatsPeriod
	}
	return &healthProber{
		cfg: hc, clock: cfg.Clock, drivers: cfg.Drivers, client: cfg.KubeClient, node: cfg.NodeName, rootDir: cfg.RootDir,
		dsw: dsw, asw: asw, gauge: gauge,
		attempted: map[oe.Key]bool{}, reported: map[oe.Key][]v1.VolumeHealthCondition{},
		storage: map[string][]storagev1.StorageHealthCondition{}, volumeErrs: map[oe.Key]string{}, storageErrs: map[string]string{},
	}
}

// newHealthProber sets up the health probes (Config.VolumeHealth) on the
// loop's caches, told of the loop's attempts and of the drivers'
// registrations.
func (vm *VolumeManager) newHealthProber() error {
	var gauge *storageHealthGauge
	if !vm.cfg.VolumeHealth.NoStorageHealth {
		var err error
		if gauge, err = newStorageHealthGauge(vm.cfg.Registerer); err != nil {
			return fmt.Errorf("volumemanager: registering csi_node_storage_health_status: %w", err)
		}
	}
	vm.health = newHealthProber(vm.cfg, gauge, vm.dsw, vm.asw)
	vm.cfg.Drivers.OnChange(vm.health.driverChanged)
	return nil
}

// attempt records that a stage or publish of a pod's volume starts: the
// loop's hook, as the kubelet's markVolumeMountAsAttempted.
func (p *healthProber) attempt(a oe.Action) {
	if a.Pod.Pod.UID == "" {
		return // a stage with no pod: nothing to report to
	}
	p.mu.Lock()
	p.attempted[oe.Key{Volume: a.Volume, Pod: a.Pod.Pod.UID}] = true
	p.mu.Unlock()
}

// run probes until ctx ends, a round, then ProbeInterval, then the next.
func (p *healthProber) run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	logger.V(2).Info("Volume health probes started", "probeInterval", p.cfg.ProbeInterval,
		"volumeHealth", p.cfg.Updater != nil, "storageHealth", !p.cfg.NoStorageHealth)
	for {
		p.probe(ctx)
		timer := p.clock.NewTimer(p.cfg.ProbeInterval)
		p.rounds.Add(1)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C():
		}
	}
}

// probe runs one round: volumes and storage side by side, as the kubelet.
func (p *healthProber) probe(ctx context.Context) {
	var wg sync.WaitGroup
	if p.cfg.Updater != nil {
		wg.Go(func() { p.probeVolumes(ctx) })
	}
	if !p.cfg.NoStorageHealth {
		wg.Go(func() { p.probeStorage(ctx) })
	}
	wg.Wait()
}

// healthTarget is one pod volume to probe.
type healthTarget struct {
	key    oe.Key
	pod    podvol.PodRef
	spec   podvol.VolumeSpec
	volume string // the pod's name for it
	// staged and published say whether the volume may be staged and
	// published for the pod; staging and publish are the paths the
	// actual state holds.
	staged, published bool
	staging, publish  string
}

// targets returns the pod volumes to probe, by key, and forgets the
// attempts of pod volumes no longer wanted. Only CSI volumes of PVs are
// probed: the kubelet leaves inline ephemeral ones out.
func (p *healthProber) targets() []healthTarget {
	p.mu.Lock()
	attempted := maps.Clone(p.attempted) // before the desired state: an attempt follows its wish
	p.mu.Unlock()
	wanted := map[oe.Key]bool{}
	var out []healthTarget
	for _, name := range p.dsw.VolumeNames() {
		spec, pods, ok := p.dsw.Volume(name)
		if !ok || spec.Plugin != "" || spec.Driver == "" || spec.Ephemeral || spec.VolumeHandle == "" {
			continue
		}
		actual, _ := p.asw.Volume(name)
		for _, pv := range pods {
			key := oe.Key{Volume: name, Pod: pv.Pod.UID}
			wanted[key] = true
			pm, has := actual.Pods[pv.Pod.UID]
			mounted := has && pm.MayBeMounted()
			if !mounted && !attempted[key] {
				continue
			}
			out = append(out, healthTarget{key: key, pod: pv.Pod, spec: spec, volume: pv.SpecName,
				staged: actual.DeviceState.MayBeMounted(), staging: actual.DeviceMountPath,
				published: has && pm.State.MayBeMounted(), publish: pm.Path})
		}
	}
	p.mu.Lock()
	for k := range attempted {
		if !wanted[k] {
			delete(p.attempted, k)
		}
	}
	p.mu.Unlock()
	slices.SortFunc(out, func(a, b healthTarget) int {
		return cmp.Or(strings.Compare(string(a.key.Volume), string(b.key.Volume)), strings.Compare(string(a.key.Pod), string(b.key.Pod)))
	})
	return out
}

// request is what NodeGetVolumeHealth is asked for t. A block volume's
// paths are its layout's (the actual state keeps other paths for it); the
// kubelet sends none for the publish of a block volume.
func (p *healthProber) request(t healthTarget, caps csi.Capabilities) csi.VolumeHealthRequest {
	req := csi.VolumeHealthRequest{VolumeID: t.spec.VolumeHandle}
	if t.spec.Mode == podvol.Block {
		if paths, err := ondisk.BlockVolumePaths(p.rootDir, t.spec.PVName, t.pod.UID); err == nil {
			if t.staged && caps.StageUnstage {
				req.StagingPath = paths.StagingPath
			}
			if t.published {
				req.PublishPath = paths.PublishPath
			}
		}
		return req
	}
	if t.staged && caps.StageUnstage {
		req.StagingPath = t.staging
	}
	if t.published {
		req.PublishPath = t.publish
	}
	return req
}

// probeVolumes asks each target's driver, if it has GET_VOLUME_HEALTH,
// and tells the Updater what changed. A failed call leaves what was
// reported as it was, as in the kubelet.
func (p *healthProber) probeVolumes(ctx context.Context) {
	logger := klog.FromContext(ctx)
	targets := p.targets()
	for _, t := range targets {
		if ctx.Err() != nil {
			return
		}
		client, err := p.drivers.Client(t.spec.Driver)
		if err != nil || !client.Capabilities().VolumeHealth {
			continue // not registered (yet), or no volume health to ask
		}
		kv := []any{"pod", t.pod.String(), "volume", t.volume, "driver", t.spec.Driver, "volumeHandle", t.spec.VolumeHandle}
		conds, err := client.NodeGetVolumeHealth(ctx, p.request(t, client.Capabilities()))
		if err == nil && !sameVolumeHealth(p.reported[t.key], conds) {
			if err = p.cfg.Updater.SetPodVolumeHealth(ctx, t.pod, t.volume, slices.Clone(conds)); err != nil {
				err = fmt.Errorf("reporting the health of volume %s of pod %s: %w", t.volume, t.pod, err)
			} else {
				logger.V(2).Info("Volume health changed", append(kv, "conditions", conds)...)
				p.reported[t.key] = conds
			}
		}
		logChange(logger, p.volumeErrs, t.key, err, "Volume health probe failed", "Volume health probe succeeded again", kv)
	}
	wanted := make(map[oe.Key]bool, len(targets))
	for _, t := range targets {
		wanted[t.key] = true
	}
	maps.DeleteFunc(p.reported, func(k oe.Key, _ []v1.VolumeHealthCondition) bool { return !wanted[k] })
	maps.DeleteFunc(p.volumeErrs, func(k oe.Key, _ string) bool { return !wanted[k] })
}

// probeStorage asks every registered driver with GET_STORAGE_HEALTH and
// writes what changed into the CSINode.
func (p *healthProber) probeStorage(ctx context.Context) {
	logger := klog.FromContext(ctx)
	drivers := p.drivers.Drivers()
	slices.Sort(drivers)
	for _, d := range drivers {
		if ctx.Err() != nil {
			return
		}
		client, err := p.drivers.Client(d)
		if err != nil || !client.Capabilities().StorageHealth {
			continue
		}
		conds, err := client.NodeGetStorageHealth(ctx)
		if err == nil {
			p.gauge.set(d, conds)
			err = p.writeStorage(ctx, d, conds)
		}
		logChange(logger, p.storageErrs, d, err, "Storage health probe failed", "Storage health probe succeeded again", []any{"driver", d})
	}
}

// writeStorage writes a driver's storage health into the CSINode unless
// it is what was last written: no API call at all while it stays so.
func (p *healthProber) writeStorage(ctx context.Context, driver string, conds []storagev1.StorageHealthCondition) error {
	p.mu.Lock()
	last, ok := p.storage[driver]
	p.mu.Unlock()
	if ok && storagehealth.Same(last, conds) {
		return nil
	}
	wrote, err := storagehealth.Update(ctx, p.client, p.node, driver, conds, metav1.NewTime(p.clock.Now()))
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		delete(p.storage, driver)
		return err
	}
	if wrote {
		klog.FromContext(ctx).V(2).Info("Storage health changed", "driver", driver, "conditions", conds)
	}
	p.storage[driver] = conds
	return nil
}

// driverChanged forgets what was written of a driver that registered
// again or went: the Registry's OnChange listener.
func (p *healthProber) driverChanged(driver string) {
	p.mu.Lock()
	delete(p.storage, driver)
	p.mu.Unlock()
}

// logChange logs err at the default level when it differs from the last
// one logged for key, and the recovery when a logged error is gone.
func logChange[K comparable](logger klog.Logger, last map[K]string, key K, err error, failed, recovered string, kv []any) {
	if err == nil {
		if _, ok := last[key]; ok {
			delete(last, key)
			logger.Info(recovered, kv...)
		}
		return
	}
	if msg := err.Error(); last[key] != msg {
		last[key] = msg
		logger.Error(err, failed, kv...)
	}
}

// sameVolumeHealth reports whether a and b hold the same (status, reason)
// pairs, the key of the API's list: the kubelet's status manager passes
// on nothing else.
func sameVolumeHealth(a, b []v1.VolumeHealthCondition) bool {
	type id struct {
		status v1.VolumeHealthStatusType
		reason string
	}
	set := func(cs []v1.VolumeHealthCondition) map[id]bool {
		m := make(map[id]bool, len(cs))
		for _, c := range cs {
			m[id{c.Status, c.Reason}] = true
		}
		return m
	}
	return maps.Equal(set(a), set(b))
}

// storageHealthGauge is the kubelet's csi_node_storage_health_status: 1
// for each (driver, status, reason) a driver reports now.
type storageHealthGauge struct{ vec *prometheus.GaugeVec }

// newStorageHealthGauge registers the gauge on reg; nil without one.
func newStorageHealthGauge(reg prometheus.Registerer) (*storageHealthGauge, error) {
	if reg == nil {
		return nil, nil
	}
	vec := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "csi_node_storage_health_status",
		Help: "CSI node storage backend health conditions currently reported (1 = present).",
	}, []string{"driver_name", "status", "reason"})
	vec, err := promreg.Reuse(reg, vec)
	if err != nil {
		return nil, err
	}
	return &storageHealthGauge{vec: vec}, nil
}

// set replaces a driver's series with its conditions now.
func (g *storageHealthGauge) set(driver string, conds []storagev1.StorageHealthCondition) {
	if g == nil {
		return
	}
	g.vec.DeletePartialMatch(prometheus.Labels{"driver_name": driver})
	for _, c := range conds {
		g.vec.WithLabelValues(driver, string(c.Status), c.Reason).Set(1)
	}
}
