package volumemanager

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/nodevol/nodevol/csi"
	"github.com/nodevol/nodevol/csiplugin"
	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/internal/promreg"
	"github.com/nodevol/nodevol/internal/tokens"
	"github.com/nodevol/nodevol/pluginmanager"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/registration"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/configmap"
	"github.com/nodevol/nodevol/volume/downwardapi"
	"github.com/nodevol/nodevol/volume/emptydir"
	"github.com/nodevol/nodevol/volume/hostpath"
	"github.com/nodevol/nodevol/volume/image"
	"github.com/nodevol/nodevol/volume/local"
	"github.com/nodevol/nodevol/volume/nfs"
	"github.com/nodevol/nodevol/volume/projected"
	"github.com/nodevol/nodevol/volume/secret"
	"github.com/nodevol/nodevol/volume/subpath"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
	"github.com/nodevol/nodevol/volumemanager/internal/podcert"
	"github.com/nodevol/nodevol/volumemanager/internal/reconciler"
	"github.com/nodevol/nodevol/volumemanager/internal/resolve"
	"github.com/nodevol/nodevol/volumemanager/internal/state"
)

// VolumeManager mounts the volumes of the pods on this node and unmounts
// them when the pods go. Create it with New, start it with Run.
type VolumeManager struct {
	cfg     Config
	factory informers.SharedInformerFactory
	// nodeFactory informs of this node's own Node (Config.Node's
	// default); nil when the caller supplies Config.Node.
	nodeFactory informers.SharedInformerFactory
	dsw         *state.DesiredStateOfWorld
	asw         *state.ActualStateOfWorld
	in          *reconciler.Inbox
	loop        *reconciler.Loop
	volumes     *volume.Registry // finds each operation's plugin
	// reconstructors are the registered plugins that leave on disk what
	// they set up, asked at start what earlier runs left.
	reconstructors []volume.Reconstructor
	runner         *oe.Runner
	results        chan oe.Outcome
	resolver       *resolve.Resolver
	// expands reports whether a registered plugin grows volumes on the
	// node (volume.Expander): only then are claims' node expansions
	// looked for.
	expands bool
	// syncs are the informer handlers' sync checkers.
	syncs []cache.DoneChecker
	// listErrs holds the last list/watch error of each informer, for
	// the wait errors while the informers cannot sync.
	listErrs *listErrors
	// plugins runs plugin registration; nil unless Config.PluginRegistration.
	plugins *pluginmanager.Manager
	// registration keeps the CSINode; nil unless Config.PluginRegistration.
	registration *registration.Handler
	// inUse reports Node.Status.VolumesInUse, or holds what the caller
	// reported; nil unless Config.ReportVolumesInUse or
	// Config.VolumesInUseReportedByCaller.
	inUse *inUseReporter
	// objects is the node's one cache of the API objects its pods'
	// volumes and containers read (configMaps, secrets, trust bundles;
	// claims, volumes and attachments unless Config.ClusterInformers),
	// held by pod (and an attachment by the volume waiting for it);
	// tokens the service account tokens of the CSI and projected plugins.
	objects *objectcache.Cache
	tokens  *tokens.Cache
	// certs issues and renews the pods' certificates (podCertificate
	// sources of projected volumes).
	certs *podcert.Manager
	// flex finds the flexVolume drivers of Config.VolumePluginDir, each a
	// plugin registered in volumes while its driver is there (flex.go).
	flex *flexDrivers
	// subpaths are the pods' subPath bind mounts (SubPaths).
	subpaths *subpath.Manager
	// conditions are the volume conditions last seen (health.go).
	conditions *conditions
	// sizeLimits reports the volumes over their size limit; nil when
	// Config.SizeLimit is Off.
	sizeLimits *sizeLimits
	// health runs the volume and storage health probes; nil unless
	// Config.VolumeHealth.
	health *healthProber
	// attachmentsOnce lists the VolumeAttachments once at start, for a
	// self-attaching node without informers of them; nil otherwise.
	attachmentsOnce *attachmentsOnce
	// runCtx holds Run's context, for scrapes (context.Background before Run).
	runCtx atomic.Pointer[context.Context]
	// ops are Run's contexts for the operations the loop starts; set by
	// Run before the loop runs.
	ops runContexts
	// ready is closed once the loop has taken in that the informers synced.
	ready chan struct{}
	// inspect runs functions on the loop's goroutine (tests).
	inspect chan func(*reconciler.Loop)
	// statesSynced is set once the loop has installed what Run found on
	// disk and made its first pass (ReconcilerStatesHasBeenSynced).
	statesSynced atomic.Bool
	// unstaged wakes the callers of WaitForUnstaged.
	unstaged unstageWaiters
}

// New checks cfg, fills in defaults and returns a VolumeManager. Nothing
// runs until Run.
func New(cfg Config) (*VolumeManager, error) {
	if err := checkConfig(cfg); err != nil {
		return nil, err
	}
	setDefaults(&cfg)
	m, err := reconciler.NewMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("volumemanager: registering metrics: %w", err)
	}
	vm := &VolumeManager{
		cfg:      cfg,
		factory:  cfg.InformerFactory,
		in:       reconciler.NewInbox(),
		runner:   oe.NewRunner(cfg.MaxConcurrentOperations),
		results:  make(chan oe.Outcome, 64),
		listErrs: &listErrors{},
		ready:    make(chan struct{}),
		inspect:  make(chan func(*reconciler.Loop)),
	}
	if vm.factory == nil {
		vm.factory = informers.NewSharedInformerFactoryWithOptions(cfg.KubeClient, 0, informers.WithTransform(resolve.TrimInformerObject))
	}
	vm.objects = objectcache.New(objectcache.Config{Client: cfg.KubeClient, Clock: cfg.Clock, OnChange: vm.in.ObjectChanged,
		TTL: cfg.ResyncPeriod, // the refresh of what may only be GET (claims, attachments; a volume with its claim)
		// 60-90 s by default: the kubelet reads a pod's claim at each pod
		// sync, every syncFrequency with jitter 0.5.
		TTLJitter: 0.5,
		Transform: resolve.TrimCachedObject})
	vm.tokens = tokens.New(cfg.KubeClient, cfg.Clock)
	if vm.certs, err = podcert.New(podcert.Config{Client: cfg.KubeClient, Clock: cfg.Clock, NodeName: cfg.NodeName,
		OnChange: vm.in.CredentialsChanged, Recorder: cfg.EventRecorder}); err != nil {
		return nil, fmt.Errorf("volumemanager: %w", err)
	}
	attachments := vm.newResolver()
	if vm.resolver.Node = cfg.Node; cfg.Node == nil {
		var err error
		if vm.nodeFactory, vm.resolver.Node, err = resolve.NodeInformer(cfg.KubeClient, cfg.NodeName, vm.in.NodeChanged, vm.in.Retry); err != nil {
			return nil, fmt.Errorf("volumemanager: %w", err)
		}
	}
	if err := vm.newPlugin(attachments); err != nil {
		return nil, err
	}
	if cfg.ReportVolumesInUse || cfg.VolumesInUseReportedByCaller {
		vm.inUse = newInUseReporter(cfg.KubeClient, cfg.NodeName, vm.attachable, cfg.Clock)
		vm.inUse.byCaller = cfg.VolumesInUseReportedByCaller
		vm.inUse.inUse = vm.GetVolumesInUse
		vm.inUse.reported = func(names []podvol.UniqueVolumeName) { vm.in.Retry(names...) }
	}
	vm.newLoop(m)
	if cfg.VolumeHealth != nil {
		if err := vm.newHealthProber(); err != nil {
			return nil, err
		}
	}
	if cfg.PluginRegistration {
		if vm.plugins, vm.registration, err = newPluginManager(cfg, vm.resolver.CSIDrivers); err != nil {
			return nil, fmt.Errorf("volumemanager: %w", err)
		}
	}
	if err := vm.registerCollectors(); err != nil {
		return nil, err
	}
	if vm.sizeLimits, err = newSizeLimits(cfg); err != nil {
		return nil, err
	}
	if err := vm.watch(vm.factory.Core().V1(), vm.factory.Storage().V1()); err != nil {
		return nil, fmt.Errorf("volumemanager: %w", err)
	}
	cfg.Drivers.OnChange(vm.in.Driver)
	return vm, nil
}

// checkConfig refuses a Config that lacks a required field or sets
// exclusive ones.
func checkConfig(cfg Config) error {
	switch {
	case cfg.NodeName == "":
		return errors.New("volumemanager: Config.NodeName is required")
	case cfg.KubeClient == nil:
		return errors.New("volumemanager: Config.KubeClient is required")
	case cfg.ReportVolumesInUse && cfg.VolumesInUseReportedByCaller:
		return errors.New("volumemanager: Config.ReportVolumesInUse and Config.VolumesInUseReportedByCaller are exclusive: the Node's status.volumesInUse has one writer")
	case cfg.ClusterInformers && cfg.NodeRestricted:
		return errors.New("volumemanager: Config.ClusterInformers and the deprecated Config.NodeRestricted are exclusive: informers list every claim, volume and attachment, node-restricted reads them one at a time")
	case cfg.VolumeHealth != nil && cfg.VolumeHealth.Updater == nil && cfg.VolumeHealth.NoStorageHealth:
		return errors.New("volumemanager: Config.VolumeHealth probes nothing: it needs an Updater, or NoStorageHealth false")
	}
	return nil
}

// newResolver sets up how pods are resolved: through the object cache's
// GETs, or (Config.ClusterInformers) through the informers' listers. It
// returns what VolumeAttachments are read through.
func (vm *VolumeManager) newResolver() storagelisters.VolumeAttachmentLister {
	cfg := vm.cfg
	core, storage := vm.factory.Core().V1(), vm.factory.Storage().V1()
	var attachments storagelisters.VolumeAttachmentLister
	if cfg.ClusterInformers {
		vm.resolver = &resolve.Resolver{PVCs: core.PersistentVolumeClaims().Lister(), PVs: core.PersistentVolumes().Lister()}
		attachments = storage.VolumeAttachments().Lister()
	} else {
		vm.resolver = &resolve.Resolver{}
		vm.resolver.PVCs, vm.resolver.PVs, attachments = resolve.Listers(vm.objects)
	}
	vm.resolver.CSIDrivers, vm.resolver.SELinuxEnabled = storage.CSIDrivers().Lister(), cfg.SELinuxEnabled()
	return attachments
}

// newPlugin sets up the volume plugins: Config.Plugin, or the CSI plugin
// built from the Config; the plugins of the other kinds (defaultPlugins);
// Config.Plugins.
func (vm *VolumeManager) newPlugin(attachments storagelisters.VolumeAttachmentLister) error {
	cfg := vm.cfg
	plugin := cfg.Plugin
	if plugin == nil {
		var err error
		plugin, err = csiplugin.New(csiplugin.Config{
			RootDir:                cfg.RootDir,
			NodeName:               cfg.NodeName,
			Registry:               cfg.Drivers,
			CSIDriverLister:        vm.resolver.CSIDrivers,
			VolumeAttachmentLister: attachments,
			KubeClient:             cfg.KubeClient,
			Tokens:                 vm.tokens,
			Mounter:                cfg.Mounter,
			BlockMapper:            cfg.BlockMapper,
			CallTimeout:            cfg.CSICallTimeout,
			BootIDPath:             cfg.BootIDPath,
			EventRecorder:          cfg.EventRecorder,
			Clock:                  cfg.Clock,
			Steps:                  cfg.Steps,
		})
		if err != nil {
			return fmt.Errorf("volumemanager: %w", err)
		}
	}
	if _, ok := plugin.(volume.SelfAttacher); cfg.SelfAttach && !ok {
		return fmt.Errorf("volumemanager: Config.SelfAttach needs a plugin that attaches volumes itself; %T does not (volume.SelfAttacher)", plugin)
	}
	subpaths, err := subpath.New(subpath.Config{RootDir: cfg.RootDir, Mounter: cfg.Mounter, Steps: cfg.Steps})
	if err != nil {
		return fmt.Errorf("volumemanager: %w", err)
	}
	vm.subpaths = subpaths
	builtin, err := defaultPlugins(cfg, vm.resolver.Node, vm.objects, vm.tokens, podCertificates{vm.certs})
	if err != nil {
		return fmt.Errorf("volumemanager: %w", err)
	}
	all := append([]volume.Plugin{plugin}, notReplaced(builtin, cfg.Plugins)...)
	all = append(all, cfg.Plugins...)
	for _, p := range all {
		if r, ok := p.(volume.Reconstructor); ok {
			vm.reconstructors = append(vm.reconstructors, r)
		}
	}
	vm.resolver.Readers = resolve.ObjectReaders(plugin, builtin, cfg.Plugins)
	vm.expands = expandsVolumes(all)
	if vm.flex, err = vm.newFlexDrivers(); err != nil {
		return fmt.Errorf("volumemanager: %w", err)
	}
	vm.reconstructors = append(vm.reconstructors, vm.flex.drivers)
	vm.resolver.Readers = append(vm.resolver.Readers, vm.flex.drivers)
	volumes, err := volume.NewRegistry(all...)
	if err == nil {
		err = volumes.CheckSources()
	}
	if err != nil {
		return fmt.Errorf("volumemanager: %w", err)
	}
	vm.volumes = volumes
	vm.resolver.Plugins = volumes
	vm.conditions = &conditions{events: cfg.EventRecorder}
	return nil
}

// defaultPlugins are the plugins of the kinds nodevol handles besides CSI,
// built from the Config (notReplaced leaves out those an embedder's plugin
// replaces).
func defaultPlugins(cfg Config, node func() (*v1.Node, error), objects *objectcache.Cache, toks *tokens.Cache, certs projected.PodCertificates) ([]volume.Plugin, error) {
	host, err := hostpath.New(hostpath.Config{Steps: cfg.Steps})
	if err != nil {
		return nil, err
	}
	empty, err := emptydir.New(emptydir.Config{RootDir: cfg.RootDir, Mounter: cfg.Mounter, Steps: cfg.Steps, AllocatableMemory: resolve.AllocatableMemory(node)})
	if err != nil {
		return nil, err
	}
	loc, err := local.New(local.Config{RootDir: cfg.RootDir, Mounter: cfg.Mounter, BlockMapper: cfg.BlockMapper, EventRecorder: cfg.EventRecorder, Steps: cfg.Steps})
	if err != nil {
		return nil, err
	}
	cm, err := configmap.New(configmap.Config{RootDir: cfg.RootDir, Mounter: cfg.Mounter, Steps: cfg.Steps, AllocatableMemory: resolve.AllocatableMemory(node), Objects: objects})
	if err != nil {
		return nil, err
	}
	sec, err := secret.New(secret.Config{RootDir: cfg.RootDir, Mounter: cfg.Mounter, Steps: cfg.Steps, AllocatableMemory: resolve.AllocatableMemory(node), Objects: objects})
	if err != nil {
		return nil, err
	}
	down, err := downwardapi.New(downwardapi.Config{RootDir: cfg.RootDir, Mounter: cfg.Mounter, Steps: cfg.Steps, NodeAllocatable: resolve.NodeAllocatable(node)})
	if err != nil {
		return nil, err
	}
	proj, err := projected.New(projected.Config{RootDir: cfg.RootDir, Mounter: cfg.Mounter, Steps: cfg.Steps,
		AllocatableMemory: resolve.AllocatableMemory(node), NodeAllocatable: resolve.NodeAllocatable(node), Objects: objects, Tokens: toks, PodCertificates: certs})
	if err != nil {
		return nil, err
	}
	nf, err := nfs.New(nfs.Config{RootDir: cfg.RootDir, Mounter: cfg.Mounter, Steps: cfg.Steps})
	if err != nil {
		return nil, err
	}
	return []volume.Plugin{image.New(), host, empty, loc, nf, cm, sec, down, proj}, nil
}

// notReplaced returns the plugins of builtin that no plugin of own (an
// embedder's, Config.Plugins) replaces: one of the same name or claiming a
// kind of source in common (volume.SharesKind).
func notReplaced(builtin, own []volume.Plugin) []volume.Plugin {
	var out []volume.Plugin
	for _, p := range builtin {
		if !slices.ContainsFunc(own, func(o volume.Plugin) bool { return o != nil && volume.SharesKind(p, o) }) {
			out = append(out, p)
		}
	}
	return out
}

// newLoop sets up the caches and the loop, wired once: the loop asks the
// manager through reconciler.Host (managerHost, loophost.go).
func (vm *VolumeManager) newLoop(m *reconciler.Metrics) {
	cfg := vm.cfg
	var l *reconciler.Loop
	vm.dsw = state.NewDesiredStateOfWorld(func(n podvol.UniqueVolumeName) {
		l.MarkDirty(n)     // the desired state is written by the loop only
		vm.inUse.changed() // nil-safe
	})
	vm.asw = state.NewActualStateOfWorld()
	lc := reconciler.Config{
		Node: cfg.NodeName, Clock: cfg.Clock, DSW: vm.dsw, ASW: vm.asw, Metrics: m, Events: cfg.EventRecorder,
		Volumes: vm.volumes, SelfAttach: cfg.SelfAttach, Expands: vm.expands, Holders: vm.objects, Ready: vm.ready,
		Host: managerHost{vm},
	}
	switch {
	case cfg.SelfAttach && cfg.ClusterInformers:
		lc.OwnAttachments = informerAttachments{vm.factory.Storage().V1().VolumeAttachments().Lister(), vm.resolver.PVs}
	case cfg.SelfAttach:
		vm.attachmentsOnce = newAttachmentsOnce(cfg.KubeClient, cfg.NodeName, cfg.Clock, vm.listErrs)
		vm.syncs = append(vm.syncs, vm.attachmentsOnce)
		lc.OwnAttachments = vm.attachmentsOnce
	}
	vm.resolver.Metrics = m
	l = reconciler.New(lc, vm.in, resolve.NewTable(vm.resolver, cfg.Clock))
	vm.loop = l
}

// attachable reports whether a volume is attached before it is staged, as
// its plugin's Capabilities say; true when they are not known yet (its
// driver is not registered), so that its wait error says what it will wait
// for.
func (vm *VolumeManager) attachable(spec *podvol.VolumeSpec) bool {
	caps, err := capabilitiesOf(vm.volumes, spec)
	return err != nil || caps.Attachable
}

// capabilitiesOf asks the plugin of spec, found in plugins, what it does
// with the volume.
func capabilitiesOf(plugins *volume.Registry, spec *podvol.VolumeSpec) (volume.Capabilities, error) {
	p, err := plugins.ForVolume(spec.Name)
	if err != nil {
		return volume.Capabilities{}, err
	}
	return p.Capabilities(spec)
}

// registerCollectors registers the volume stats and counts with
// Config.Registerer, if set.
func (vm *VolumeManager) registerCollectors() error {
	reg := vm.cfg.Registerer
	if reg == nil {
		return nil
	}
	// Several managers may share the registerer: each one's stats are
	// collected, its counts summed with the others'.
	if !vm.cfg.VolumeStatsCollectedByCaller {
		if err := promreg.Fan(reg, newVolumeStatsCollector(vm, vm.cfg.VolumeStatsPeriod)); err != nil {
			return fmt.Errorf("volumemanager: registering volume stats: %w", err)
		}
	}
	if err := registerTotalVolumes(reg, vm.dsw, vm.asw); err != nil {
		return fmt.Errorf("volumemanager: registering volume counts: %w", err)
	}
	return nil
}

// Drivers returns the CSI driver registry: register a driver's endpoint
// there, or let plugin registration do it (Config.PluginRegistration).
func (vm *VolumeManager) Drivers() *csi.Registry { return vm.cfg.Drivers }

// MarkPodsSynced tells the manager that every pod running on the node has
// been added (AddPod) before this call: the pods added so far are the full
// set. Until then, volumes found on disk at start (left by an earlier run)
// are not torn down, because their pods may simply not have been added
// yet. After it, a volume found on disk is torn down only once every pod
// added before the call has been resolved into the desired state and none
// wants it; a pod that cannot be resolved (PVC missing, API error) keeps
// its volumes mounted until it is deleted or resolves. A pod whose claim
// or volume the API server has not answered for yet (its GET failing or
// in flight; with Config.ClusterInformers, their first list) keeps every
// volume found on disk, since it may want any of them, until it resolves
// or is deleted. Called before Run
// has read the disk, it takes effect when it has. A node agent calls it
// once its pod source has delivered its initial list (for an informer:
// when the event handler's registration HasSynced).
func (vm *VolumeManager) MarkPodsSynced() { vm.in.MarkPodsSynced() }

// AddPod tells the manager that pod runs on this node and needs its volumes.
// It returns at once; the pod is processed by the loop. Before it returns,
// the pod holds the configMaps and secrets its containers read (Objects,
// unless Config.EnvReadByCaller). The manager keeps its own copy of what it
// reads from the pod (resolve.Keep), not the pod. A pod
// whose spec.nodeName names another node than Config.NodeName is refused
// with an error naming the pod and both nodes, and nothing is done for it;
// a pod with no nodeName is accepted (unit tests, static pods of a kubelet
// fork). Where a pod came from is not checked: the kubelet v1.37.2 refuses
// a static pod that references an API object (a service account, a
// configMap, a secret, a claim, ...) in its pod config source, and an
// embedder that reads static pods must refuse them there too.
func (vm *VolumeManager) AddPod(pod *v1.Pod) error {
	if err := vm.checkNode(pod); err != nil {
		return err
	}
	vm.in.AddPod(resolve.Keep(pod, vm.volumes), func() { vm.holdContainerObjects(pod) })
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
func (vm *VolumeManager) DeletePod(pod *v1.Pod) { vm.in.DeletePod(pod.UID) }

// GetMountedVolumesForPod returns the pod's volumes that are mounted (not
// Uncertain), by spec name: a volume the pod has under several names (one
// PVC in two of its volumes) is mounted once and listed under each, with
// the same path.
func (vm *VolumeManager) GetMountedVolumesForPod(uid types.UID) []podvol.MountedVolume {
	var out []podvol.MountedVolume
	for _, v := range vm.podVolumes(uid) {
		if v.State != podvol.Mounted {
			continue
		}
		if spec, ok := vm.asw.Volume(v.Name); ok {
			caps, err := capabilitiesOf(vm.volumes, &spec.Spec)
			v.ProvidedByRuntime = err == nil && caps.ProvidedByRuntime
			v.ReadOnly = v.ReadOnly || err == nil && caps.ReadOnly
		}
		out = append(out, v)
	}
	return out
}

// podGone drops what the node kept for a pod that is gone: its objects'
// holds (its containers' unless it was added again meanwhile), its
// service account tokens and its pod certificates.
func (vm *VolumeManager) podGone(uid types.UID) {
	vm.objects.Release(resolve.PodHolder(uid))
	vm.in.IfGone(uid, func() { vm.objects.Release(containersHolder(uid)) })
	vm.tokens.Forget(uid)
	vm.certs.Forget(uid)
}

// holdObjects makes pod uid hold in the object cache what its volumes
// and containers read (resolve.PodObjects), and unless Config.ClusterInformers its
// claims and the volumes they are known bound to (resolve.ClaimRefs): called
// at each resolution of the pod, before it, so that a claim found bound
// adds its volume.
func (vm *VolumeManager) holdObjects(uid types.UID, pod *v1.Pod) {
	refs := append(resolve.PodObjects(vm.resolver.Readers, pod), vm.resolver.PVObjects(pod)...)
	if vm.cfg.ClusterInformers {
		vm.objects.Hold(resolve.PodHolder(uid), refs...) // none: Release
		return
	}
	held := append(slices.Clip(refs), resolve.ClaimRefs(vm.objects, pod)...)
	vm.objects.Hold(resolve.PodHolder(uid), held...)
	// A claim held first just now may have answered already: its volume
	// is held before the resolver reads it, or the answer, which no read
	// waited for, would not be announced and the pod would not be
	// resolved again.
	if now := append(refs, resolve.ClaimRefs(vm.objects, pod)...); !slices.Equal(now, held) {
		vm.objects.Hold(resolve.PodHolder(uid), now...)
	}
}

// SubPaths returns the manager of the pods' subPath bind mounts under
// Config.RootDir: a container runtime or a kubelet fork calls its Prepare
// for each volumeMount with a subPath before it starts the container
// (with MountedVolume.DirName as the volume), and CleanPod before it
// removes a pod's directory. The volume manager cleans a volume's subPath
// mounts before it unpublishes the volume.
func (vm *VolumeManager) SubPaths() *subpath.Manager { return vm.subpaths }

// HasPossiblyMountedVolumesForPod reports whether any volume of the pod is
// mounted or may be (Uncertain, or an operation on it is running): the
// pod's directory must not be removed yet.
func (vm *VolumeManager) HasPossiblyMountedVolumesForPod(uid types.UID) bool {
	return len(vm.asw.PodVolumes(uid)) > 0
}

// GetVolumesInUse returns, sorted, the attachable volumes that pods want
// or that may still be set up on the node: what Node.Status.VolumesInUse
// should report so that the attach/detach controller detaches none in use.
// As the kubelet's, it lists only the volumes whose plugin attaches them
// (Capabilities.Attachable: a CSI PV whose CSIDriver does not say
// attachRequired: false); a volume that is never attached (a CSI volume
// inline in the pod, a CSI driver that needs no attach, emptyDir, local,
// configMap, ...) is not listed. A volume whose plugin cannot tell yet
// (its CSI driver is not registered) is listed: reporting one too many
// keeps a volume attached, one too few could see it detached in use.
func (vm *VolumeManager) GetVolumesInUse() []podvol.UniqueVolumeName {
	seen := map[podvol.UniqueVolumeName]bool{}
	for _, n := range vm.dsw.VolumeNames() {
		if spec, ok := vm.dsw.Spec(n); ok {
			seen[n] = vm.attachable(&spec)
		}
	}
	for _, n := range vm.asw.VolumeNames() {
		if _, known := seen[n]; known {
			continue
		}
		if spec, ok := vm.asw.Spec(n); ok {
			seen[n] = vm.attachable(&spec)
		}
	}
	out := make([]podvol.UniqueVolumeName, 0, len(seen))
	for n, attachable := range seen {
		if attachable {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// idle reports whether the loop has nothing queued, to plan or running
// (false while Run is not running). For tests.
func (vm *VolumeManager) idle() bool {
	done := make(chan bool, 1)
	select {
	case vm.inspect <- func(l *reconciler.Loop) { done <- l.Idle() }:
		return <-done
	case <-time.After(time.Second):
		return false
	}
}
