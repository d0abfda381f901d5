package volumemanager

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	storageinformers "k8s.io/client-go/informers/storage/v1"
	"k8s.io/client-go/kubernetes"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"
	"k8s.io/utils/clock"

	vcache "github.com/nodevol/nodevol/cache"
	"github.com/nodevol/nodevol/csiplugin"
	oe "github.com/nodevol/nodevol/operationexecutor"
	"github.com/nodevol/nodevol/pluginmanager"
)

// Config configures a VolumeManager. NodeName and KubeClient are required;
// every other field has the default its comment gives.
type Config struct {
	// NodeName is this node's name. Required.
	NodeName string
	// KubeClient reads PVCs, PVs, CSIDrivers, VolumeAttachments and Secrets. Required.
	KubeClient kubernetes.Interface
	// RootDir holds pods/, plugins/ and plugins_registry/, as the kubelet's
	// root directory does. Default "/var/lib/kubelet".
	RootDir string
	// Mounter checks and removes mount points. Default mount.New("").
	Mounter mount.Interface
	// Clock drives backoff and the resync. Default the real clock.
	Clock clock.WithTicker
	// Registerer, if set, receives the manager's Prometheus metrics.
	Registerer prometheus.Registerer
	// EventRecorder, if set, records FailedMount and FailedAttachVolume events on pods.
	EventRecorder record.EventRecorder
	// InformerFactory, if set, is used (and started by Run) instead of a new one.
	InformerFactory informers.SharedInformerFactory
	// Drivers is the CSI driver registry. Default: a new one, reachable through Drivers().
	Drivers *csiplugin.Registry
	// BlockMapper maps raw block devices into pods. Default: bind mounts
	// through Mounter and loop devices through losetup (util/blockdev).
	BlockMapper csiplugin.BlockMapper
	// Plugin replaces the CSI plugin built from the fields above (tests,
	// other plugins). Default: csiplugin.New.
	Plugin oe.Plugin
	// CSICallTimeout bounds each CSI call. Default 2 minutes, the kubelet's.
	CSICallTimeout time.Duration
	// ResyncPeriod is how often every volume is planned again, to catch
	// changes made behind nodevol's back. Default 1 minute.
	ResyncPeriod time.Duration
	// Workers is the number of volumes planned at once. Default 4.
	Workers int
	// MaxConcurrentOperations bounds CSI operations in flight. Default 64.
	MaxConcurrentOperations int
	// MountTimeout bounds WaitForAttachAndMount and WaitForUnmount when the
	// caller's context has no deadline. Default 2m3s, the kubelet's.
	MountTimeout time.Duration
	// PluginRegistration, when true, makes Run also run a plugin manager on
	// RegistrationDir: CSI drivers announced there by their registrars
	// (node-driver-registrar) are registered in Drivers and recorded on the
	// Node and CSINode, as with the kubelet. Default false: drivers are
	// registered through Drivers().Register.
	PluginRegistration bool
	// RegistrationDir is the plugin registration directory. Default
	// {RootDir}/plugins_registry.
	RegistrationDir string // ReportVolumesInUse, when true, makes Run keep the Node's
	// status.volumesInUse equal to GetVolumesInUse, as the kubelet's node
	// status does, and confirm the attachment of a volume that needs one
	// only after it has been reported: the attach/detach controller then
	// never detaches a volume that may be mounted. A node agent that
	// reports volumesInUse itself leaves it false. Default false.
	ReportVolumesInUse bool
	// VolumeStatsPeriod is how long the kubelet_volume_stats_* gauges (with
	// a Registerer) reuse a volume's NodeGetVolumeStats answer. Default 1
	// minute, the kubelet's --volume-stats-agg-period.
	VolumeStatsPeriod time.Duration
}

// VolumeManager mounts the CSI volumes of the pods on this node and unmounts
// them when the pods go. Create it with New, start it with Run.
type VolumeManager struct {
	cfg      Config
	factory  informers.SharedInformerFactory
	dsw      *vcache.DesiredStateOfWorld
	asw      *vcache.ActualStateOfWorld
	rec      *reconciler
	resolver *resolver
	synced   []cache.InformerSynced

	podQueue workqueue.TypedInterface[types.UID]
	podMu    sync.Mutex
	pods     map[types.UID]*v1.Pod
	// pending maps "namespace/claim" to the pods waiting for that claim to resolve.
	pending map[string]map[types.UID]struct{}
	// claimEvents counts PVC and PV events. A pod worker that saw it change
	// while it resolved a pod resolves the pod again: the event may have
	// come before the pod was recorded as waiting for its claim.
	claimEvents uint64
	ready       chan struct{} // closed once informers are synced
	held        reconstructed
	// csiDrivers reads CSIDriver objects (requiresRepublish).
	csiDrivers storagelisters.CSIDriverLister
	// plugins runs plugin registration; nil unless Config.PluginRegistration.
	plugins *pluginmanager.Manager
	// inUse reports Node.Status.VolumesInUse; nil unless Config.ReportVolumesInUse.
	inUse *inUseReporter
	// expander grows mounted volumes; nil when the plugin cannot.
	expander nodeExpander
	// stats asks drivers for volume usage; nil when the plugin cannot.
	stats statsGetter
	// runCtx holds Run's context, for the operations that informer
	// handlers start and for scrapes (context.Background before Run).
	runCtx atomic.Pointer[context.Context]
}

// New checks cfg, fills in defaults and returns a VolumeManager. Nothing
// runs until Run.
func New(cfg Config) (*VolumeManager, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("volumemanager: Config.NodeName is required")
	}
	if cfg.KubeClient == nil {
		return nil, errors.New("volumemanager: Config.KubeClient is required")
	}
	setDefaults(&cfg)
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("volumemanager: registering metrics: %w", err)
	}
	vm := &VolumeManager{
		cfg:      cfg,
		factory:  cfg.InformerFactory,
		podQueue: workqueue.NewTyped[types.UID](),
		pods:     map[types.UID]*v1.Pod{},
		pending:  map[string]map[types.UID]struct{}{},
		ready:    make(chan struct{}),
	}
	if vm.factory == nil {
		vm.factory = informers.NewSharedInformerFactory(cfg.KubeClient, 0)
	}
	queue := workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[vcache.UniqueVolumeName]{Name: "nodevol-volumes", Clock: cfg.Clock})
	vm.dsw = vcache.NewDesiredStateOfWorld(func(n vcache.UniqueVolumeName) {
		queue.Add(n)
		vm.inUse.changed() // nil-safe
	})
	vm.asw = vcache.NewActualStateOfWorld()
	core, storage := vm.factory.Core().V1(), vm.factory.Storage().V1()
	vm.csiDrivers = storage.CSIDrivers().Lister()
	vm.resolver = &resolver{pvcs: core.PersistentVolumeClaims().Lister(), pvs: core.PersistentVolumes().Lister()}
	plugin := cfg.Plugin
	if plugin == nil {
		plugin, err = csiplugin.New(csiplugin.Config{
			RootDir:                cfg.RootDir,
			NodeName:               cfg.NodeName,
			Registry:               cfg.Drivers,
			CSIDriverLister:        storage.CSIDrivers().Lister(),
			VolumeAttachmentLister: storage.VolumeAttachments().Lister(),
			Secrets:                csiplugin.NewSecretGetter(cfg.KubeClient),
			Tokens:                 csiplugin.NewTokenGetter(cfg.KubeClient, cfg.Clock),
			Mounter:                cfg.Mounter,
			BlockMapper:            cfg.BlockMapper,
			CallTimeout:            cfg.CSICallTimeout,
		})
		if err != nil {
			return nil, fmt.Errorf("volumemanager: %w", err)
		}
	}
	vm.expander, _ = plugin.(nodeExpander)
	vm.stats, _ = plugin.(statsGetter)
	vm.rec = &reconciler{
		dsw: vm.dsw, asw: vm.asw, plugin: plugin, queue: queue, events: cfg.EventRecorder, metrics: m,
		exec:    oe.New(oe.Options{Clock: cfg.Clock, MaxConcurrent: cfg.MaxConcurrentOperations}),
		lastErr: map[types.UID]map[string]error{},
	}
	if cfg.PluginRegistration {
		if vm.plugins, err = newPluginManager(cfg); err != nil {
			return nil, fmt.Errorf("volumemanager: %w", err)
		}
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(newVolumeStatsCollector(vm, cfg.VolumeStatsPeriod)); err != nil {
			return nil, fmt.Errorf("volumemanager: registering volume stats: %w", err)
		}
	}
	if err := vm.watch(core, storage); err != nil {
		return nil, fmt.Errorf("volumemanager: %w", err)
	}
	vm.rec.hold = vm.held.hold
	if cfg.ReportVolumesInUse {
		vm.inUse = newInUseReporter(cfg.KubeClient, cfg.NodeName, vm.csiDrivers, cfg.Clock)
		vm.inUse.inUse = vm.GetVolumesInUse
		vm.inUse.reported = func(names []vcache.UniqueVolumeName) { vm.rec.retry(names...) }
		vm.rec.attachGate = vm.inUse.hold
		vm.rec.forgotten = vm.inUse.changed
	}
	cfg.Drivers.OnChange(func(driver string) {
		vm.rec.retry(vm.dsw.VolumesOfDriver(driver)...)
		vm.rec.retry(vm.reconstructedOf(driver)...)
	})
	return vm, nil
}

// context returns Run's context, or context.Background before Run.
func (vm *VolumeManager) context() context.Context {
	if p := vm.runCtx.Load(); p != nil {
		return *p
	}
	return context.Background()
}

func setDefaults(cfg *Config) {
	if cfg.RootDir == "" {
		cfg.RootDir = "/var/lib/kubelet"
	}
	if cfg.Mounter == nil {
		cfg.Mounter = mount.New("")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Drivers == nil {
		cfg.Drivers = csiplugin.NewRegistry(csiplugin.RegistryOptions{Registerer: cfg.Registerer})
	}
	if cfg.CSICallTimeout <= 0 {
		cfg.CSICallTimeout = 2 * time.Minute
	}
	if cfg.ResyncPeriod <= 0 {
		cfg.ResyncPeriod = time.Minute
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.VolumeStatsPeriod <= 0 {
		cfg.VolumeStatsPeriod = time.Minute
	}
	if cfg.RegistrationDir == "" {
		cfg.RegistrationDir = filepath.Join(cfg.RootDir, "plugins_registry")
	}
	if cfg.MountTimeout <= 0 {
		cfg.MountTimeout = 2*time.Minute + 3*time.Second
	}
}

// Drivers returns the CSI driver registry: register a driver's endpoint
// there, or let plugin registration do it (Config.PluginRegistration).
func (vm *VolumeManager) Drivers() *csiplugin.Registry { return vm.cfg.Drivers }

// Run starts the informers, the populator, the reconciler and (with
// Config.PluginRegistration) plugin registration, and blocks until ctx is
// done and every worker and operation has returned.
func (vm *VolumeManager) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithName("volumemanager")
	ctx = klog.NewContext(ctx, logger)
	vm.runCtx.Store(&ctx) // before the informers start: their handlers read it
	vm.factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), vm.synced...) {
		vm.shutdown()
		return fmt.Errorf("volumemanager: informer caches did not sync: %w", context.Cause(ctx))
	}
	// Before any pod is processed: what an earlier run left on disk.
	for _, n := range vm.reconstruct(ctx) {
		vm.rec.queue.Add(n)
	}
	close(vm.ready)
	logger.V(2).Info("Volume manager started", "node", vm.cfg.NodeName, "rootDir", vm.cfg.RootDir)

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); vm.podWorker(ctx) }()
	go func() { defer wg.Done(); vm.runPluginManager(ctx) }()
	if vm.inUse != nil {
		wg.Add(1)
		go func() { defer wg.Done(); vm.inUse.run(ctx) }()
	}
	for i := 0; i < vm.cfg.Workers; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); vm.rec.worker(ctx) }()
	}
	ticker := vm.cfg.Clock.NewTicker(vm.cfg.ResyncPeriod)
	defer ticker.Stop()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-ticker.C():
			vm.resync()
			republish(ctx, vm.csiDrivers, vm.dsw, vm.asw, vm.rec)
			vm.checkAllExpansions(ctx)
		}
	}
	vm.shutdown()
	wg.Wait()
	vm.rec.exec.Wait()
	vm.factory.Shutdown()
	logger.V(2).Info("Volume manager stopped")
	return nil
}

func (vm *VolumeManager) shutdown() {
	vm.podQueue.ShutDown()
	vm.rec.queue.ShutDown()
}

// resync plans every known volume again and re-resolves pods with errors.
func (vm *VolumeManager) resync() {
	for _, n := range vm.dsw.VolumeNames() {
		vm.rec.queue.Add(n)
	}
	for _, n := range vm.asw.VolumeNames() {
		vm.rec.queue.Add(n)
	}
	vm.requeuePending()
}

// AddPod tells the manager that pod runs on this node and needs its volumes.
// It returns at once; the pod is processed in the background.
func (vm *VolumeManager) AddPod(pod *v1.Pod) {
	vm.podMu.Lock()
	vm.pods[pod.UID] = pod.DeepCopy()
	vm.podMu.Unlock()
	vm.podQueue.Add(pod.UID)
}

// UpdatePod is AddPod for a pod that changed.
func (vm *VolumeManager) UpdatePod(pod *v1.Pod) { vm.AddPod(pod) }

// DeletePod tells the manager that the pod is gone (its containers have
// stopped): its volumes are unmounted, and unstaged when no other pod uses them.
func (vm *VolumeManager) DeletePod(pod *v1.Pod) {
	vm.podMu.Lock()
	delete(vm.pods, pod.UID)
	vm.podMu.Unlock()
	vm.podQueue.Add(pod.UID)
}

// podWorker resolves pods into the desired state.
func (vm *VolumeManager) podWorker(ctx context.Context) {
	logger := klog.FromContext(ctx)
	for {
		uid, quit := vm.podQueue.Get()
		if quit {
			return
		}
		vm.podMu.Lock()
		pod := vm.pods[uid]
		events := vm.claimEvents
		vm.podMu.Unlock()
		if pod == nil {
			vm.dsw.DeletePod(uid)
			vm.rec.forgetPod(uid)
			vm.setPending(uid, nil)
		} else {
			ref, wanted, resolved, errs := vm.resolver.resolvePod(pod)
			vm.dsw.SetPod(ref, wanted, resolved, errs)
			claims := waitingClaims(pod, errs)
			vm.setPending(uid, claims)
			vm.podMu.Lock()
			missed := len(claims) > 0 && vm.claimEvents != events
			vm.podMu.Unlock()
			if missed {
				vm.podQueue.Add(uid) // processed again after Done
			}
			for name, err := range errs {
				logger.V(2).Info("Cannot resolve volume yet", "pod", klog.KObj(pod), "volume", name, "err", err)
			}
		}
		vm.podQueue.Done(uid)
	}
}

// setPending records the claims a pod waits for (none: it waits for nothing).
func (vm *VolumeManager) setPending(uid types.UID, claims []string) {
	vm.podMu.Lock()
	defer vm.podMu.Unlock()
	for key, pods := range vm.pending {
		delete(pods, uid)
		if len(pods) == 0 {
			delete(vm.pending, key)
		}
	}
	for _, key := range claims {
		if vm.pending[key] == nil {
			vm.pending[key] = map[types.UID]struct{}{}
		}
		vm.pending[key][uid] = struct{}{}
	}
}

// waitingClaims returns the "namespace/claim" keys of the pod's volumes that
// failed to resolve. Inline volumes wait for no claim; they resolve at once.
func waitingClaims(pod *v1.Pod, errs map[string]error) []string {
	var out []string
	for _, v := range pod.Spec.Volumes {
		if errs[v.Name] == nil {
			continue
		}
		switch {
		case v.PersistentVolumeClaim != nil:
			out = append(out, pod.Namespace+"/"+v.PersistentVolumeClaim.ClaimName)
		case v.Ephemeral != nil:
			out = append(out, pod.Namespace+"/"+pod.Name+"-"+v.Name)
		}
	}
	return out
}

// requeueClaim resolves again the pods waiting for a claim.
func (vm *VolumeManager) requeueClaim(key string) {
	vm.podMu.Lock()
	vm.claimEvents++
	var uids []types.UID
	for uid := range vm.pending[key] {
		uids = append(uids, uid)
	}
	vm.podMu.Unlock()
	for _, uid := range uids {
		vm.podQueue.Add(uid)
	}
}

// requeuePending resolves again every pod that has unresolved volumes.
func (vm *VolumeManager) requeuePending() {
	vm.podMu.Lock()
	uids := map[types.UID]struct{}{}
	for _, pods := range vm.pending {
		for uid := range pods {
			uids[uid] = struct{}{}
		}
	}
	vm.podMu.Unlock()
	for uid := range uids {
		vm.podQueue.Add(uid)
	}
}

// watch hooks the informers up: PVC and PV changes resolve the pods waiting
// for them again; VolumeAttachment and CSIDriver changes retry their volumes
// at once instead of waiting out a backoff.
func (vm *VolumeManager) watch(core coreinformers.Interface, storage storageinformers.Interface) error {
	onClaim := func(obj any) {
		switch o := unwrap(obj).(type) {
		case *v1.PersistentVolumeClaim:
			vm.requeueClaim(o.Namespace + "/" + o.Name)
			vm.checkExpansion(vm.context(), o.Namespace, o.Name)
		case *v1.PersistentVolume:
			if r := o.Spec.ClaimRef; r != nil {
				vm.requeueClaim(r.Namespace + "/" + r.Name)
				vm.checkExpansion(vm.context(), r.Namespace, r.Name)
			}
		}
	}
	onAttachment := func(obj any) {
		va, ok := unwrap(obj).(*storagev1.VolumeAttachment)
		if !ok || va.Spec.NodeName != vm.cfg.NodeName || va.Spec.Source.PersistentVolumeName == nil {
			return
		}
		if name, ok := vm.dsw.VolumeForPV(*va.Spec.Source.PersistentVolumeName); ok {
			vm.rec.retry(name)
		}
	}
	onDriver := func(obj any) {
		if d, ok := unwrap(obj).(*storagev1.CSIDriver); ok {
			vm.rec.retry(vm.dsw.VolumesOfDriver(d.Name)...)
		}
	}
	for _, h := range []struct {
		inf cache.SharedIndexInformer
		fn  func(any)
	}{
		{core.PersistentVolumeClaims().Informer(), onClaim},
		{core.PersistentVolumes().Informer(), onClaim},
		{storage.VolumeAttachments().Informer(), onAttachment},
		{storage.CSIDrivers().Informer(), onDriver},
	} {
		fn := h.fn
		reg, err := h.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    fn,
			UpdateFunc: func(_, obj any) { fn(obj) },
			DeleteFunc: fn,
		})
		if err != nil {
			return fmt.Errorf("adding informer handler: %w", err)
		}
		vm.synced = append(vm.synced, reg.HasSynced)
	}
	return nil
}

func unwrap(obj any) any {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return t.Obj
	}
	return obj
}

// WaitForAttachAndMount blocks until every CSI volume of the pod is mounted,
// or ctx ends (bounded by Config.MountTimeout when ctx has no deadline).
// Its error names each volume that is not mounted and why.
func (vm *VolumeManager) WaitForAttachAndMount(ctx context.Context, pod *v1.Pod) error {
	vm.podMu.Lock()
	_, known := vm.pods[pod.UID]
	vm.podMu.Unlock()
	if !known {
		vm.AddPod(pod)
	}
	vols, _ := podCSIVolumes(pod)
	return vm.wait(ctx, pod, func() []string {
		mounted := map[string]bool{}
		for _, v := range vm.asw.PodVolumes(pod.UID) {
			mounted[v.SpecName] = v.State == vcache.Mounted
		}
		var missing []string
		for _, v := range vols {
			if !mounted[v.Name] {
				missing = append(missing, v.Name)
			}
		}
		return missing
	}, "unmounted volumes")
}

// WaitForUnmount blocks until no volume of the pod may still be mounted
// (Uncertain counts as mounted), or ctx ends.
func (vm *VolumeManager) WaitForUnmount(ctx context.Context, pod *v1.Pod) error {
	return vm.wait(ctx, pod, func() []string {
		var left []string
		for _, v := range vm.asw.PodVolumes(pod.UID) {
			left = append(left, v.SpecName)
		}
		return left
	}, "volumes still mounted")
}

// wait re-checks pending() after every change to the pod's mounts until it
// returns nothing or ctx ends.
func (vm *VolumeManager) wait(ctx context.Context, pod *v1.Pod, pending func() []string, what string) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, vm.cfg.MountTimeout)
		defer cancel()
	}
	for {
		changed := vm.asw.PodChanged(pod.UID) // before the check: no change is missed
		left := pending()
		if len(left) == 0 {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return vm.waitError(ctx, pod, left, what)
		}
	}
}

func (vm *VolumeManager) waitError(ctx context.Context, pod *v1.Pod, left []string, what string) error {
	errs := vm.rec.podErrors(pod.UID)
	if st, ok := vm.dsw.Pod(pod.UID); ok {
		for k, v := range st.Errors {
			errs[k] = v
		}
	}
	sort.Strings(left)
	var b strings.Builder
	fmt.Fprintf(&b, "pod %s/%s: %s=%v", pod.Namespace, pod.Name, what, left)
	for _, name := range left {
		if err := errs[name]; err != nil {
			fmt.Fprintf(&b, "; %s: %v", name, err)
		}
	}
	return fmt.Errorf("%s: %w", b.String(), context.Cause(ctx))
}

// GetMountedVolumesForPod returns the pod's volumes that are mounted (not
// Uncertain), by spec name.
func (vm *VolumeManager) GetMountedVolumesForPod(uid types.UID) []vcache.MountedVolume {
	var out []vcache.MountedVolume
	for _, v := range vm.asw.PodVolumes(uid) {
		if v.State == vcache.Mounted {
			out = append(out, v)
		}
	}
	return out
}

// HasPossiblyMountedVolumesForPod reports whether any volume of the pod is
// mounted or may be (Uncertain): the pod's directory must not be removed yet.
func (vm *VolumeManager) HasPossiblyMountedVolumesForPod(uid types.UID) bool {
	return len(vm.asw.PodVolumes(uid)) > 0
}

// GetVolumesInUse returns, sorted, every volume that pods want or that may
// still be set up on the node: what Node.Status.VolumesInUse should report
// so that no volume in use is detached.
func (vm *VolumeManager) GetVolumesInUse() []vcache.UniqueVolumeName {
	seen := map[vcache.UniqueVolumeName]bool{}
	for _, n := range vm.dsw.VolumeNames() {
		seen[n] = true
	}
	for _, n := range vm.asw.VolumeNames() {
		seen[n] = true
	}
	out := make([]vcache.UniqueVolumeName, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
