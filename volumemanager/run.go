package volumemanager

import (
	"context"
	"sync"
	"time"

	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/internal/fsgroup"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/volume"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
	"github.com/nodevol/nodevol/volumemanager/internal/reconciler"
)

// context returns Run's context, or context.Background before Run.
func (vm *VolumeManager) context() context.Context {
	if p := vm.runCtx.Load(); p != nil {
		return *p
	}
	return context.Background()
}

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
	vm.loop.SetLogger(logger)
	opCtx, stopOps := vm.operationContext(ctx)
	defer stopOps()
	vm.ops = runContexts{run: ctx, op: opCtx}
	vm.factory.Start(ctx.Done())
	if vm.nodeFactory != nil {
		vm.nodeFactory.Start(ctx.Done())
	}
	var wg sync.WaitGroup
	// The flexVolume drivers present now are initialised before what
	// they left on disk is looked for.
	wg.Go(func() { vm.runFlex(ctx) })
	select {
	case <-vm.flex.drivers.Started():
	case <-ctx.Done():
	}
	// What an earlier run left on disk, before any pod is planned: the
	// disk needs no API server.
	vm.loop.Install(vm.reconstruct(ctx))

	wg.Go(func() {
		// Event-driven: each checker's channel closes when its informer
		// handler has seen the initial list (no polling).
		if cache.WaitFor(ctx, "", vm.syncs...) {
			vm.in.MarkInformersSynced()
		}
	})
	if vm.nodeFactory != nil {
		wg.Go(func() {
			// A Node that exists is announced by its informer's add; one
			// that does not is known missing only once the informer has
			// synced, and the pods waiting for it then fall back to the
			// machine's figures (resolve.AllocatableMemory): resolve them again.
			for _, ok := range vm.nodeFactory.WaitForCacheSync(ctx.Done()) {
				if !ok {
					return
				}
			}
			vm.in.NodeChanged()
		})
	}
	if vm.attachmentsOnce != nil {
		wg.Go(func() { vm.attachmentsOnce.run(ctx) })
	}
	wg.Go(func() { vm.objects.Run(ctx) })
	wg.Go(func() { vm.certs.Run(ctx) })
	wg.Go(func() { vm.runPluginManager(ctx) })
	wg.Go(func() { vm.runRegistration(ctx) })
	if vm.health != nil {
		wg.Go(func() { vm.health.run(ctx) })
	}
	if vm.sizeLimits != nil {
		wg.Go(func() { vm.runSizeLimits(ctx) })
	}
	if vm.inUse != nil && !vm.inUse.byCaller {
		wg.Go(func() { vm.inUse.run(ctx) })
	}
	logger.V(2).Info("Volume manager started", "node", vm.cfg.NodeName, "rootDir", vm.cfg.RootDir)
	vm.run(ctx)
	wg.Wait()
	vm.factory.Shutdown()
	if vm.nodeFactory != nil {
		vm.nodeFactory.Shutdown()
	}
	vm.unstaged.stop()
	logger.V(2).Info("Volume manager stopped")
	return nil
}

// runContexts are Run's context and the context operations run with
// (shutdown.go).
type runContexts struct{ run, op context.Context }

// start runs an operation the loop began (its start hook) on the runner;
// its outcome comes back on results. Run has set vm.ops before the loop
// starts anything.
func (vm *VolumeManager) start(a oe.Action, in reconciler.Input) {
	ctx, opCtx := vm.ops.run, vm.ops.op
	notRun := func(err error) { vm.results <- oe.Outcome{Action: a, Spec: in.Spec, Err: err, NotRun: true} }
	vm.runner.Go(ctx, func(ctx context.Context) {
		if err := ctx.Err(); err != nil {
			notRun(err) // queued when Run's context ended: not started
			return
		}
		vm.results <- vm.execute(opCtx, a, in)
	}, notRun)
}

// run is the loop's one select.
func (vm *VolumeManager) run(ctx context.Context) {
	l := vm.loop
	resync := vm.cfg.Clock.NewTicker(vm.cfg.ResyncPeriod)
	defer resync.Stop()
	retries := l.Retries()
	defer retries.Stop()
	for {
		l.Process(ctx)
		vm.statesSynced.Store(true) // the disk's state was installed before the first pass
		vm.unstaged.wake()          // every change of the states is made in a step
		l.Due()
		if l.Pending() {
			continue // due() found retries that are due now
		}
		retries.Arm() // the wake-up: armed for the earliest retry
		select {
		case <-ctx.Done():
			vm.drain(ctx)
			return
		case <-vm.in.Kick():
		case o := <-vm.results:
			l.Apply(o)
		case <-retries.C():
			retries.Fired()
		case <-resync.C():
			l.Resync()
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
			vm.loop.Apply(o)
			vm.unstaged.wake()
		case <-done:
			for {
				select {
				case o := <-vm.results:
					vm.loop.Apply(o)
					vm.unstaged.wake()
				default:
					return
				}
			}
		}
	}
}

// execute runs one operation the loop started and returns its outcome.
func (vm *VolumeManager) execute(ctx context.Context, a oe.Action, in reconciler.Input) oe.Outcome {
	if m := vm.loop.Metrics; m != nil {
		spec := in.Spec
		ctx = fsgroup.WithObserver(ctx, func(took time.Duration, err error) { m.AccessControl(&spec, took, err) })
	}
	if a.Kind == oe.OpExpand {
		return vm.expand(ctx, a, in)
	}
	if a.CleanSubPaths {
		if out, ok := vm.cleanSubPaths(ctx, a, in); !ok {
			return out
		}
	}
	out := oe.Do(ctx, vm.volumes, a, in.Input)
	vm.resourceExhausted(out)
	if a.Kind == oe.OpPublish && a.Expand > 0 && out.Err == nil {
		vm.expandAfterPublish(ctx, a, in, &out)
	}
	return out
}

// cleanSubPaths unmounts and removes the subPath bind mounts of the pod's
// volume before it is unpublished, when the planner asks for it
// (Action.CleanSubPaths). A failure fails the unpublish, which is retried;
// the volume's own mount is untouched, so it stays as it was.
func (vm *VolumeManager) cleanSubPaths(ctx context.Context, a oe.Action, in reconciler.Input) (oe.Outcome, bool) {
	spec := in.Spec
	err := vm.subpaths.CleanVolume(ctx, a.Pod.Pod.UID, ondisk.VolumeDirName(&spec, a.Pod))
	if err == nil {
		return oe.Outcome{}, true
	}
	return oe.Outcome{Action: a, Spec: spec, Err: oe.OpError(a, spec, &reconciler.SubPathError{Err: err})}, false
}

// reconstruct asks each plugin that leaves something on disk what earlier
// runs left (volume.Reconstructor), all compared with one recovery, then
// cleans the subPath mounts of the pod volumes none of them found
// (cleanDroppedSubPaths).
func (vm *VolumeManager) reconstruct(ctx context.Context) volume.Found {
	rc := vm.recovery(ctx)
	var out volume.Found
	for _, r := range vm.reconstructors {
		f := r.Reconstruct(ctx, rc)
		out.Mounts = append(out.Mounts, f.Mounts...)
		out.Devices = append(out.Devices, f.Devices...)
		out.Unreadable = append(out.Unreadable, f.Unreadable...)
		out.Attempted += f.Attempted
	}
	vm.cleanDroppedSubPaths(ctx, rc, out)
	return out
}

// retakeUnreadable removes pod volume directory dir, found unreadable at
// start, once nothing in it can hold data any more (Retake of the plugins
// that reconstruct), reading the mount table afresh. It reports whether
// dir is gone.
func (vm *VolumeManager) retakeUnreadable(dir string) bool {
	mps, err := vm.cfg.Mounter.List()
	if err != nil {
		return false
	}
	mounted := make(map[string]bool, len(mps))
	for _, mp := range mps {
		mounted[mp.Path] = true
	}
	for _, r := range vm.reconstructors {
		if r.Retake(vm.context(), dir, mounted) {
			return true
		}
	}
	return false
}

// recovery is what reconstruction compares the plugins' records with: the
// boot ID and the mount table, read once.
func (vm *VolumeManager) recovery(ctx context.Context) volume.Recovery {
	logger := klog.FromContext(ctx)
	var rc volume.Recovery
	// The file the plugins' records take their boot ID from
	// (Config.BootIDPath), read once.
	if id, err := ondisk.ReadBootID(vm.cfg.BootIDPath); err != nil {
		logger.Error(err, "Restart cannot tell a reboot from a crash: volumes found on disk are Uncertain")
	} else {
		rc.BootID = id
	}
	mps, err := vm.cfg.Mounter.List()
	if err != nil {
		logger.Error(err, "Cannot list mount points: volumes found on disk are Uncertain")
		return rc
	}
	rc.MountPoints = make(map[string]bool, len(mps))
	for _, mp := range mps {
		rc.MountPoints[mp.Path] = true
	}
	return rc
}
