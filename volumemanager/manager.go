package volumemanager

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	storageinformers "k8s.io/client-go/informers/storage/v1"
	"k8s.io/client-go/kubernetes"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"
	"k8s.io/utils/clock"

	vcache "github.com/nodevol/nodevol/cache"
	"github.com/nodevol/nodevol/csi"
	"github.com/nodevol/nodevol/csiplugin"
	"github.com/nodevol/nodevol/internal/ondisk"
	oe "github.com/nodevol/nodevol/internal/operationexecutor"
	"github.com/nodevol/nodevol/pluginmanager"
	"github.com/nodevol/nodevol/registration"
	"github.com/nodevol/nodevol/util/backoff"
	"github.com/nodevol/nodevol/util/promreg"
	"github.com/nodevol/nodevol/util/step"
	"github.com/nodevol/nodevol/volume"
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
	// EventRecorder, if set, records FailedMount and FailedAttachVolume events on pods,
	// and VolumePermissionChangeInProgress when an fsGroup ownership change runs long.
	EventRecorder record.EventRecorder
	// InformerFactory, if set, is used (and started by Run) instead of a new one.
	InformerFactory informers.SharedInformerFactory
	// Drivers is the CSI driver registry. Default: a new one, reachable through Drivers().
	Drivers *csi.Registry
	// BlockMapper maps raw block devices into pods. Default: bind mounts
	// through Mounter and loop devices through losetup (util/blockdev).
	BlockMapper csiplugin.BlockMapper
	// Plugin replaces the CSI plugin built from the fields above (tests,
	// other plugins). Default: csiplugin.New.
	Plugin volume.Plugin
	// CSICallTimeout bounds each CSI call. Default 2 minutes, the kubelet's.
	CSICallTimeout time.Duration
	// ResyncPeriod is how often every volume is planned again, to catch
	// changes made behind nodevol's back. Default 1 minute.
	ResyncPeriod time.Duration
	// Workers is unused: one loop plans every volume (planning is cheap;
	// operations run concurrently, bounded by MaxConcurrentOperations).
	// Kept so that existing callers compile.
	//
	// Deprecated: has no effect.
	Workers int
	// MaxConcurrentOperations bounds CSI operations in flight. Default 32
	// per CPU (runtime.GOMAXPROCS), at least 64: see
	// defaultMaxConcurrentOperations.
	MaxConcurrentOperations int
	// MountTimeout bounds WaitForAttachAndMount and WaitForUnmount when the
	// caller's context has no deadline. Default 2m3s, the kubelet's.
	MountTimeout time.Duration
	// ClaimPendingGracePeriod is how long a pod volume's claim may be
	// missing or not bound before WaitForAttachAndMount takes it as final
	// and returns (errors.Is(err, ErrFinal)), measured from when the loop
	// first saw that pod volume so. Default 5s: the scheduler places no pod
	// whose claims are unbound, so a claim still missing on the node is
	// informer lag (the pod may reach the node before its claim reaches the
	// claim informer: well under a second on a healthy cluster) or a
	// mistake that waiting out MountTimeout will not mend.
	ClaimPendingGracePeriod time.Duration
	// ShutdownGracePeriod is how long the operations in flight when Run's
	// context ends may go on before their contexts are cancelled too
	// (volumemanager/shutdown.go): Run starts nothing new once its context
	// is done and returns when every operation has. Default 0: they are
	// cancelled at once.
	ShutdownGracePeriod time.Duration
	// PluginRegistration, when true, makes Run also run a plugin manager on
	// RegistrationDir: CSI drivers announced there by their registrars
	// (node-driver-registrar) are registered in Drivers and recorded on the
	// Node and CSINode, as with the kubelet. Default false: drivers are
	// registered through Drivers().Register.
	PluginRegistration bool
	// RegistrationDir is the plugin registration directory. Default
	// {RootDir}/plugins_registry.
	RegistrationDir string
	// ReportVolumesInUse, when true, makes Run keep the Node's
	// status.volumesInUse equal to GetVolumesInUse, as the kubelet's node
	// status does, and confirm the attachment of a volume that needs one
	// only after it has been reported: the attach/detach controller then
	// never detaches a volume that may be mounted. A node agent that
	// reports volumesInUse itself leaves it false. Default false.
	ReportVolumesInUse bool
	// BootIDPath is the file that tells the node's boot ID (default
	// /proc/sys/kernel/random/boot_id). The CSI plugin writes it into its
	// records of work in flight, and Run compares them with it: a record
	// of another boot means the node rebooted and nothing is mounted any
	// more. Tests replace the file to simulate a reboot.
	BootIDPath string
	// NodeRestricted, when true, reads PersistentVolumeClaims,
	// PersistentVolumes and VolumeAttachments one at a time with GET and
	// caches them, instead of listing and watching every one in the
	// cluster: what a node may do under the Node authorizer, which forbids
	// a node to list or watch them (a kubelet's own credentials,
	// CN=system:node:NAME in group system:nodes). An object is fetched when
	// a pod first needs it and again every ResyncPeriod while it is used;
	// a VolumeAttachment not yet attached is polled, every second at first.
	// CSIDrivers still come through an informer. Without it, a forbidden
	// list is reported in the wait errors with a pointer to this field.
	// Default false: informers, which cost no request per volume.
	NodeRestricted bool
	// SELinuxEnabled reports whether the host has SELinux enabled; asked
	// once, by New. Pods' volumes are mounted with an SELinux context only
	// where it does (volumemanager/selinux.go). Default: selinuxfs is
	// mounted read-write at /sys/fs/selinux and this process has an SELinux
	// label, as go-selinux's GetEnabled decides.
	SELinuxEnabled func() bool
	// SelfAttach, when true, makes the node attach volumes itself, as the
	// kubelet does with --enable-controller-attach-detach=false: it
	// creates each volume's VolumeAttachment (csi-sha256(handle, driver,
	// node), spec as the attach/detach controller writes it), waits for
	// the external-attacher to attach it, and deletes it after the
	// volume's last unstage, waiting until it is gone. The client then
	// needs create, get and delete on volumeattachments, and the Node must
	// not carry the annotation volumes.kubernetes.io/controller-managed-attach-detach
	// (SetNodeAttachMode). ReportVolumesInUse does not hold the attach in
	// this mode. Default false: the attach/detach controller attaches, and
	// the node waits for it.
	SelfAttach bool
	// Steps, if set, sees every change the manager makes to the node
	// before it is made (package util/step): the default plugin's
	// directories, files, records, mounts, loop devices, CSI calls and
	// VolumeAttachments (csiplugin.Config.Steps), and reconstruction's
	// clean-up at Run. An error from it is returned in place of the
	// change. It is the seam of the crash-point suite, which stops at every
	// step; a Plugin or BlockMapper the caller supplies is the caller's to
	// hook. Default: none.
	Steps step.Hook
	// VolumeStatsPeriod is how long the kubelet_volume_stats_* gauges (with
	// a Registerer) reuse a volume's NodeGetVolumeStats answer. Default 1
	// minute, the kubelet's --volume-stats-agg-period.
	VolumeStatsPeriod time.Duration
	// VolumesInUseReportedByCaller, when true, says that the caller keeps
	// the Node's status.volumesInUse itself (a kubelet fork's node status
	// loop, fed by GetVolumesInUse) and calls MarkVolumesAsReportedInUse
	// with what it has reported: a volume that needs attaching is confirmed
	// attached, and staged, only once that list names it, as with
	// ReportVolumesInUse. The two are exclusive: New refuses both. Default
	// false: MarkVolumesAsReportedInUse has no effect.
	VolumesInUseReportedByCaller bool
}

// VolumeManager mounts the CSI volumes of the pods on this node and unmounts
// them when the pods go. Create it with New, start it with Run.
type VolumeManager struct {
	cfg      Config
	factory  informers.SharedInformerFactory
	dsw      *vcache.DesiredStateOfWorld
	asw      *vcache.ActualStateOfWorld
	in       *inbox
	loop     *loop
	plugin   volume.Plugin
	volumes  *volume.Registry // finds each operation's plugin; holds plugin
	runner   *oe.Runner
	results  chan oe.Outcome
	resolver *resolver
	// syncs are the informer handlers' sync checkers.
	syncs []cache.DoneChecker
	// listErrs holds the last list/watch error of each informer, for
	// the wait errors while the informers cannot sync.
	listErrs *listErrors
	// fetcher GETs PVCs, PVs and VolumeAttachments; nil unless
	// Config.NodeRestricted.
	fetcher *fetcher
	// csiDrivers reads CSIDriver objects.
	csiDrivers storagelisters.CSIDriverLister
	// plugins runs plugin registration; nil unless Config.PluginRegistration.
	plugins *pluginmanager.Manager
	// registration keeps the CSINode; nil unless Config.PluginRegistration.
	registration *registration.Handler
	// inUse reports Node.Status.VolumesInUse, or holds what the caller
	// reported; nil unless Config.ReportVolumesInUse or
	// Config.VolumesInUseReportedByCaller.
	inUse *inUseReporter
	// expander grows mounted volumes; nil when the plugin cannot.
	expander nodeExpander
	// stats asks drivers for volume usage; nil when the plugin cannot.
	stats statsGetter
	// conditions are the volume conditions last seen (health.go).
	conditions *conditions
	// runCtx holds Run's context, for scrapes (context.Background before Run).
	runCtx atomic.Pointer[context.Context]
	// ready is closed once the loop has taken in that the informers synced.
	ready chan struct{}
	// inspect runs functions on the loop's goroutine (tests).
	inspect chan func(*loop)
	// statesSynced is set once the loop has installed what Run found on
	// disk and made its first pass (ReconcilerStatesHasBeenSynced).
	statesSynced atomic.Bool
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
	if cfg.ReportVolumesInUse && cfg.VolumesInUseReportedByCaller {
		return nil, errors.New("volumemanager: Config.ReportVolumesInUse and Config.VolumesInUseReportedByCaller are exclusive: the Node's status.volumesInUse has one writer")
	}
	setDefaults(&cfg)
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("volumemanager: registering metrics: %w", err)
	}
	vm := &VolumeManager{
		cfg:      cfg,
		factory:  cfg.InformerFactory,
		in:       newInbox(),
		runner:   oe.NewRunner(cfg.MaxConcurrentOperations),
		results:  make(chan oe.Outcome, 64),
		listErrs: &listErrors{},
		ready:    make(chan struct{}),
		inspect:  make(chan func(*loop)),
	}
	if vm.factory == nil {
		vm.factory = informers.NewSharedInformerFactoryWithOptions(cfg.KubeClient, 0, informers.WithTransform(trimInformerObject))
	}
	core, storage := vm.factory.Core().V1(), vm.factory.Storage().V1()
	vm.csiDrivers = storage.CSIDrivers().Lister()
	var attachments storagelisters.VolumeAttachmentLister
	if cfg.NodeRestricted {
		f := newFetcher(cfg.KubeClient, cfg.Clock, cfg.ResyncPeriod)
		f.claim, f.attachment = vm.in.claim, vm.in.attachment
		vm.fetcher = f
		vm.resolver = &resolver{pvcs: fetchedPVCs{f}, pvs: fetchedPVs{f}}
		attachments = fetchedVAs{f}
	} else {
		vm.resolver = &resolver{pvcs: core.PersistentVolumeClaims().Lister(), pvs: core.PersistentVolumes().Lister()}
		attachments = storage.VolumeAttachments().Lister()
	}
	vm.resolver.csiDrivers, vm.resolver.seLinuxEnabled = vm.csiDrivers, cfg.SELinuxEnabled()
	vm.plugin = cfg.Plugin
	if vm.plugin == nil {
		vm.plugin, err = csiplugin.New(csiplugin.Config{
			RootDir:                cfg.RootDir,
			NodeName:               cfg.NodeName,
			Registry:               cfg.Drivers,
			CSIDriverLister:        storage.CSIDrivers().Lister(),
			VolumeAttachmentLister: attachments,
			KubeClient:             cfg.KubeClient,
			Secrets:                csiplugin.NewSecretGetter(cfg.KubeClient),
			Tokens:                 csiplugin.NewTokenGetter(cfg.KubeClient, cfg.Clock),
			Mounter:                cfg.Mounter,
			BlockMapper:            cfg.BlockMapper,
			CallTimeout:            cfg.CSICallTimeout,
			BootIDPath:             cfg.BootIDPath,
			EventRecorder:          cfg.EventRecorder,
			Clock:                  cfg.Clock,
			Steps:                  cfg.Steps,
		})
		if err != nil {
			return nil, fmt.Errorf("volumemanager: %w", err)
		}
	}
	if _, ok := vm.plugin.(volume.SelfAttacher); cfg.SelfAttach && !ok {
		return nil, fmt.Errorf("volumemanager: Config.SelfAttach needs a plugin that attaches volumes itself; %T does not (volume.SelfAttacher)", vm.plugin)
	}
	if vm.volumes, err = volume.NewRegistry(vm.plugin); err != nil {
		return nil, fmt.Errorf("volumemanager: %w", err)
	}
	vm.expander, _ = vm.plugin.(nodeExpander)
	vm.stats, _ = vm.plugin.(statsGetter)
	vm.conditions = &conditions{events: cfg.EventRecorder}
	var l *loop
	vm.dsw = vcache.NewDesiredStateOfWorld(func(n vcache.UniqueVolumeName) {
		l.markDirty(n)     // the desired state is written by the loop only
		vm.inUse.changed() // nil-safe
	})
	vm.asw = vcache.NewActualStateOfWorld()
	l = newLoop(loop{
		node: cfg.NodeName, clock: cfg.Clock, in: vm.in, resolver: vm.resolver, csiDrivers: vm.csiDrivers,
		dsw: vm.dsw, asw: vm.asw, metrics: m, events: cfg.EventRecorder, logger: klog.Background(),
		backoff: oe.NewBackoff(oe.BackoffOptions{}), synced: func() { close(vm.ready) },
		resolveAll: cfg.NodeRestricted, selfAttach: cfg.SelfAttach,
	})
	if vm.expander != nil {
		l.expansion = vm.resolver.pendingExpansion
	}
	if cfg.SelfAttach && !cfg.NodeRestricted {
		l.ownAttachments = storage.VolumeAttachments().Lister()
	}
	l.retake = vm.retakeUnreadable
	vm.loop = l
	if cfg.PluginRegistration {
		if vm.plugins, vm.registration, err = newPluginManager(cfg, vm.csiDrivers); err != nil {
			return nil, fmt.Errorf("volumemanager: %w", err)
		}
	}
	if cfg.Registerer != nil {
		// Several managers may share the registerer: each one's stats are
		// collected, its counts summed with the others'.
		if err := promreg.Fan(cfg.Registerer, newVolumeStatsCollector(vm, cfg.VolumeStatsPeriod)); err != nil {
			return nil, fmt.Errorf("volumemanager: registering volume stats: %w", err)
		}
		if err := registerTotalVolumes(cfg.Registerer, vm.dsw, vm.asw); err != nil {
			return nil, fmt.Errorf("volumemanager: registering volume counts: %w", err)
		}
	}
	if err := vm.watch(core, storage); err != nil {
		return nil, fmt.Errorf("volumemanager: %w", err)
	}
	if cfg.ReportVolumesInUse || cfg.VolumesInUseReportedByCaller {
		vm.inUse = newInUseReporter(cfg.KubeClient, cfg.NodeName, vm.csiDrivers, cfg.Clock)
		vm.inUse.byCaller = cfg.VolumesInUseReportedByCaller
		vm.inUse.inUse = vm.GetVolumesInUse
		vm.inUse.reported = func(names []vcache.UniqueVolumeName) { vm.in.retry(names...) }
		l.attachHeld = vm.inUse.hold
		l.forgotten = vm.inUse.changed
	}
	cfg.Drivers.OnChange(vm.in.driver)
	return vm, nil
}

// defaultMaxConcurrentOperations is Config.MaxConcurrentOperations'
// default: 32 operations in flight per CPU, at least 64. An operation
// spends most of its time waiting (on the driver, on the file system), so
// the CPUs are kept busy only when enough operations are in flight to cover
// those waits: mounting 5,000 pods on 2 CPUs took 1.5 times as long with
// 16 in flight as with 64, and 256 gained nothing over 64
// (BenchmarkMaxConcurrentOperations, docs/PERFORMANCE.md). A fixed 64 would
// be 4 per CPU on 16 CPUs, below what 2 CPUs already showed to limit.
func defaultMaxConcurrentOperations() int {
	return max(64, 32*runtime.GOMAXPROCS(0))
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
		cfg.Drivers = csi.NewRegistry(csi.RegistryOptions{Registerer: cfg.Registerer})
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
	if cfg.MaxConcurrentOperations <= 0 {
		cfg.MaxConcurrentOperations = defaultMaxConcurrentOperations()
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
	if cfg.ClaimPendingGracePeriod <= 0 {
		cfg.ClaimPendingGracePeriod = 5 * time.Second
	}
	if cfg.SELinuxEnabled == nil {
		cfg.SELinuxEnabled = hostSELinuxEnabled
	}
}

// Drivers returns the CSI driver registry: register a driver's endpoint
// there, or let plugin registration do it (Config.PluginRegistration).
func (vm *VolumeManager) Drivers() *csi.Registry { return vm.cfg.Drivers }

// Run starts the informers, reads what an earlier run left on disk,
// and runs the reconcile loop (and, with Config.PluginRegistration, plugin
// registration; with Config.ReportVolumesInUse, the Node status reporter)
// until ctx is done and every operation has returned. Pods added before
// the informers have synced wait for them; nothing found on disk is torn
// down before MarkPodsSynced.
func (vm *VolumeManager) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithName("volumemanager")
	ctx = klog.NewContext(ctx, logger)
	vm.runCtx.Store(&ctx)
	vm.loop.logger = logger
	opCtx, stopOps := vm.operationContext(ctx)
	defer stopOps()
	vm.loop.start = func(a oe.Action, in opInput) {
		notRun := func(err error) { vm.results <- oe.Outcome{Action: a, Spec: in.Spec, Err: err, NotRun: true} }
		vm.runner.Go(ctx, func(ctx context.Context) {
			if err := ctx.Err(); err != nil {
				notRun(err) // queued when Run's context ended: not started
				return
			}
			vm.results <- vm.execute(opCtx, a, in)
		}, notRun)
	}
	vm.factory.Start(ctx.Done())
	// What an earlier run left on disk, before any pod is planned: the
	// disk needs no API server.
	vm.loop.install(reconstruct(ctx, vm.cfg.RootDir, vm.recovery(ctx)))

	var wg sync.WaitGroup
	wg.Go(func() {
		// Event-driven: each checker's channel closes when its informer
		// handler has seen the initial list (no polling).
		if cache.WaitFor(ctx, "", vm.syncs...) {
			vm.in.markInformersSynced()
		}
	})
	wg.Go(func() { vm.runPluginManager(ctx) })
	wg.Go(func() { vm.runRegistration(ctx) })
	if vm.fetcher != nil {
		wg.Go(func() { vm.fetcher.run(ctx) })
	}
	if vm.inUse != nil && !vm.inUse.byCaller {
		wg.Go(func() { vm.inUse.run(ctx) })
	}
	logger.V(2).Info("Volume manager started", "node", vm.cfg.NodeName, "rootDir", vm.cfg.RootDir)
	vm.run(ctx)
	wg.Wait()
	vm.factory.Shutdown()
	logger.V(2).Info("Volume manager stopped")
	return nil
}

// run is the loop's one select.
func (vm *VolumeManager) run(ctx context.Context) {
	l := vm.loop
	resync := vm.cfg.Clock.NewTicker(vm.cfg.ResyncPeriod)
	defer resync.Stop()
	timer := backoff.NewTimer(vm.cfg.Clock)
	defer timer.Stop()
	for {
		l.process(ctx)
		vm.statesSynced.Store(true) // the disk's state was installed before the first pass
		// The backoff timer: armed for the earliest retry.
		next := l.due()
		if len(l.dirty) > 0 {
			continue // due() found retries that are due now
		}
		timer.Set(next)
		select {
		case <-ctx.Done():
			vm.drain(ctx)
			return
		case <-vm.in.kick:
		case o := <-vm.results:
			l.apply(o)
		case <-timer.C():
			timer.Fired()
		case <-resync.C():
			l.resync()
		case fn := <-vm.inspect:
			fn(l)
		}
	}
}

// drain applies the outcomes of the operations still running (cancelled
// through ctx) until all have returned.
func (vm *VolumeManager) drain(ctx context.Context) {
	done := make(chan struct{})
	go func() { vm.runner.Wait(); close(done) }()
	for {
		select {
		case o := <-vm.results:
			vm.loop.apply(o)
		case <-done:
			for {
				select {
				case o := <-vm.results:
					vm.loop.apply(o)
				default:
					return
				}
			}
		}
	}
}

// execute runs one operation the loop started and returns its outcome.
func (vm *VolumeManager) execute(ctx context.Context, a oe.Action, in opInput) oe.Outcome {
	if a.Kind == oe.OpExpand {
		return vm.expand(ctx, a, in)
	}
	out := oe.Do(ctx, vm.volumes, a, in.Input)
	vm.resourceExhausted(out)
	if a.Kind == oe.OpPublish && a.Expand > 0 && out.Err == nil {
		vm.expandAfterPublish(ctx, a, in, &out)
	}
	return out
}

// MarkPodsSynced tells the manager that every pod running on the node has
// been added (AddPod) before this call: the pods added so far are the full
// set. Until then, volumes found on disk at start (left by an earlier run)
// are not torn down, because their pods may simply not have been added
// yet. After it, a volume found on disk is torn down only once every pod
// added before the call has been resolved into the desired state and none
// wants it; a pod that cannot be resolved (PVC missing, API error) keeps
// its volumes mounted until it is deleted or resolves. Called before Run
// has read the disk, it takes effect when it has. A node agent calls it
// once its pod source has delivered its initial list (for an informer:
// when the event handler's registration HasSynced).
func (vm *VolumeManager) MarkPodsSynced() { vm.in.markPodsSynced() }

// AddPod tells the manager that pod runs on this node and needs its volumes.
// It returns at once; the pod is processed by the loop. The manager keeps
// its own copy of what it reads from the pod (keepPod), not the pod. A pod
// whose spec.nodeName names another node than Config.NodeName is refused
// with an error naming the pod and both nodes, and nothing is done for it;
// a pod with no nodeName is accepted (unit tests, static pods of a kubelet
// fork).
func (vm *VolumeManager) AddPod(pod *v1.Pod) error {
	if err := vm.checkNode(pod); err != nil {
		return err
	}
	vm.in.addPod(keepPod(pod))
	return nil
}

// UpdatePod is AddPod for a pod that changed. A pod that moved to another
// node is refused as AddPod refuses it; what was added before stays.
func (vm *VolumeManager) UpdatePod(pod *v1.Pod) error { return vm.AddPod(pod) }

// checkNode refuses a pod bound to another node: mounting its volumes here
// would put a second writer on them behind the scheduler's back.
func (vm *VolumeManager) checkNode(pod *v1.Pod) error {
	if n := pod.Spec.NodeName; n != "" && n != vm.cfg.NodeName {
		return fmt.Errorf("volumemanager: pod %s/%s is bound to node %q, not to this node %q: its volumes are not mounted here", pod.Namespace, pod.Name, n, vm.cfg.NodeName)
	}
	return nil
}

// DeletePod tells the manager that the pod is gone (its containers have
// stopped): its volumes are unmounted, and unstaged when no other pod uses them.
func (vm *VolumeManager) DeletePod(pod *v1.Pod) { vm.in.deletePod(pod.UID) }

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

// watch hooks the informers up: PVC and PV changes resolve the pods waiting
// for them again (and may make a node expansion due); VolumeAttachment and
// CSIDriver changes retry their volumes at once instead of waiting out a
// backoff. A list or watch error is remembered for the wait errors.
func (vm *VolumeManager) watch(core coreinformers.Interface, storage storageinformers.Interface) error {
	onClaim := func(obj any) {
		switch o := unwrap(obj).(type) {
		case *v1.PersistentVolumeClaim:
			vm.in.claim(o.Namespace + "/" + o.Name)
		case *v1.PersistentVolume:
			if r := o.Spec.ClaimRef; r != nil {
				vm.in.claim(r.Namespace + "/" + r.Name)
			}
		}
	}
	onAttachment := func(obj any) {
		if va, ok := unwrap(obj).(*storagev1.VolumeAttachment); ok && va.Spec.NodeName == vm.cfg.NodeName {
			vm.in.attachment(va.Name) // the loop knows which volume waits for it
		}
	}
	onDriver := func(obj any) {
		if d, ok := unwrap(obj).(*storagev1.CSIDriver); ok {
			vm.in.driver(d.Name)
			if vm.registration != nil { // its allocatable refresh period may have changed
				vm.registration.CSIDriverChanged(d.Name)
			}
		}
	}
	type watched struct {
		what string
		inf  cache.SharedIndexInformer
		fn   func(any)
	}
	hs := []watched{{"CSIDrivers", storage.CSIDrivers().Informer(), onDriver}}
	if !vm.cfg.NodeRestricted { // fetched one by one instead (fetch.go)
		hs = append(hs,
			watched{"PersistentVolumeClaims", core.PersistentVolumeClaims().Informer(), onClaim},
			watched{"PersistentVolumes", core.PersistentVolumes().Informer(), onClaim},
			watched{"VolumeAttachments", storage.VolumeAttachments().Informer(), onAttachment})
	}
	for _, h := range hs {
		fn, what := h.fn, h.what
		// Fails only for an informer already started (Config.InformerFactory):
		// its errors are then not in the wait errors.
		_ = h.inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
			vm.listErrs.set(what, listError(what, err))
			cache.DefaultWatchErrorHandler(ctx, r, err)
		})
		reg, err := h.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { vm.listErrs.set(what, nil); fn(obj) },
			UpdateFunc: func(_, obj any) { fn(obj) },
			DeleteFunc: fn,
		})
		if err != nil {
			return fmt.Errorf("adding informer handler: %w", err)
		}
		vm.syncs = append(vm.syncs, reg.HasSyncedChecker())
	}
	return nil
}

// listError is an informer's list or watch error, for the wait errors. A
// node's own credentials may not list claims, volumes or attachments (the
// Node authorizer): the error then says which mode works there.
func listError(what string, err error) error {
	if apierrors.IsForbidden(err) && what != "CSIDrivers" {
		return fmt.Errorf("%w (with a node's own credentials, under the Node authorizer, set Config.NodeRestricted: "+
			"claims, volumes and attachments are then read one at a time)", err)
	}
	return err
}

func unwrap(obj any) any {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return t.Obj
	}
	return obj
}

// listErrors holds the last list or watch error of each informer.
type listErrors struct {
	mu   sync.Mutex
	errs map[string]error
}

func (l *listErrors) set(what string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err == nil {
		delete(l.errs, what)
		return
	}
	if l.errs == nil {
		l.errs = map[string]error{}
	}
	l.errs[what] = err
}

func (l *listErrors) get() map[string]error {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]error, len(l.errs))
	for k, v := range l.errs {
		out[k] = v
	}
	return out
}

// informersSynced reports whether every informer has listed once.
func (vm *VolumeManager) informersSynced() bool {
	for _, c := range vm.syncs {
		select {
		case <-c.Done():
		default:
			return false
		}
	}
	return true
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
// mounted or may be (Uncertain, or an operation on it is running): the
// pod's directory must not be removed yet.
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

// idle reports whether the loop has nothing queued, to plan or running
// (false while Run is not running). For tests.
func (vm *VolumeManager) idle() bool {
	done := make(chan bool, 1)
	select {
	case vm.inspect <- func(l *loop) { done <- l.idle() }:
		return <-done
	case <-time.After(time.Second):
		return false
	}
}

// recovery is what reconstruction compares nodevol's records with: the
// boot ID and the mount table, read once.
func (vm *VolumeManager) recovery(ctx context.Context) recovery {
	logger := klog.FromContext(ctx)
	rc := recovery{steps: vm.cfg.Steps}
	if p, ok := vm.plugin.(interface{ BootID() string }); ok {
		// The boot ID the plugin writes into its records, read once.
		rc.bootID = p.BootID()
	} else if id, err := ondisk.ReadBootID(vm.cfg.BootIDPath); err != nil {
		logger.Error(err, "Restart cannot tell a reboot from a crash: volumes found on disk are Uncertain")
	} else {
		rc.bootID = id
	}
	mps, err := vm.cfg.Mounter.List()
	if err != nil {
		logger.Error(err, "Cannot list mount points: volumes found on disk are Uncertain")
		return rc
	}
	rc.mountPoints = make(map[string]bool, len(mps))
	for _, mp := range mps {
		rc.mountPoints[mp.Path] = true
	}
	return rc
}
