package csitest

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// AttacherOptions configure the fake attacher. The zero value marks every
// VolumeAttachment attached as soon as it is seen, with no metadata.
type AttacherOptions struct {
	// Driver, when set, limits the attacher to VolumeAttachments whose
	// spec.attacher is Driver, as the external-attacher of one driver does.
	// Default: every VolumeAttachment.
	Driver string
	// Delay is how long the attacher waits after seeing a VolumeAttachment
	// before it writes the status. Default 0.
	Delay time.Duration
	// Metadata is written to status.attachmentMetadata of attached volumes
	// (the publish_context the driver's ControllerPublishVolume returned,
	// which the node passes to NodeStageVolume). Default none.
	Metadata map[string]string
	// Fail maps PV names to an attach error message: the attacher sets
	// status.attachError with that message instead of attaching. Default
	// none.
	Fail map[string]string
	// Clock measures Delay. Default the real clock.
	Clock clock.Clock
	// Node, when set, makes the attacher play the attach/detach controller
	// for that node too: it creates the VolumeAttachment (AttachVolume) of
	// every CSI PersistentVolume (of Driver, when set) whose driver needs
	// attaching (its CSIDriver is missing or does not say attachRequired:
	// false), then attaches it like any other, and deletes it when the PV
	// is deleted. The controller attaches only the volumes of pods
	// scheduled to the node; a unit test's fake clientset usually holds no
	// pods, so every PV counts as used there. Default "": the attacher
	// creates nothing, and the test calls AttachVolume.
	Node string
}

// RunFakeAttacher plays the external-attacher against client (usually a
// fake clientset) until ctx ends: it watches VolumeAttachments through an
// informer and, for each one that has neither been attached nor failed and
// is not being deleted, waits opts.Delay and then sets status.attached and
// status.attachmentMetadata, or status.attachError for the PVs in
// opts.Fail. It does nothing on deletion: a real external-attacher detaches
// first, which the node cannot observe. It returns ctx.Err() once its
// informer and workers have stopped.
//
// Unless opts.Node is set, it does not create VolumeAttachments: on a real
// cluster the attach-detach controller does, or the node itself in
// self-attach mode (volumemanager.Config.SelfAttach), whose
// VolumeAttachments it attaches like any other. Tests that want the
// controller's role too set opts.Node, or call AttachVolume for each PV
// and node.
func RunFakeAttacher(ctx context.Context, client kubernetes.Interface, opts AttacherOptions) error {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	opts.Metadata = maps.Clone(opts.Metadata)
	opts.Fail = maps.Clone(opts.Fail)
	a := &fakeAttacher{client: client, opts: opts, inFlight: make(map[string]bool)}
	logger := klog.FromContext(ctx).WithName("fakeattacher")
	ctx = klog.NewContext(ctx, logger)

	factory := informers.NewSharedInformerFactory(client, 0)
	informer := factory.Storage().V1().VolumeAttachments().Informer()
	handle := func(obj any) {
		if va, ok := obj.(*storagev1.VolumeAttachment); ok {
			a.consider(ctx, va)
		}
	}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    handle,
		UpdateFunc: func(_, obj any) { handle(obj) },
	}); err != nil {
		return fmt.Errorf("csitest: watching VolumeAttachments: %w", err)
	}
	startControl := func() error { return nil }
	if opts.Node != "" {
		var err error
		if startControl, err = a.control(ctx, factory); err != nil {
			return err
		}
	}
	factory.Start(ctx.Done())
	if err := startControl(); err != nil && ctx.Err() == nil {
		factory.Shutdown()
		a.wg.Wait()
		return err
	}
	<-ctx.Done()
	// Shutdown waits for the informer's goroutines, so that no handler
	// starts a worker after wg.Wait.
	factory.Shutdown()
	a.wg.Wait()
	return ctx.Err()
}

// NewFakeAttacher runs RunFakeAttacher for a test until the test ends, and
// waits for it to return then.
func NewFakeAttacher(tb testing.TB, client kubernetes.Interface, opts AttacherOptions) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = RunFakeAttacher(ctx, client, opts)
	}()
	tb.Cleanup(func() {
		cancel()
		<-done
	})
}

type fakeAttacher struct {
	client kubernetes.Interface
	opts   AttacherOptions
	wg     sync.WaitGroup

	mu sync.Mutex
	// inFlight holds the names of the VolumeAttachments a worker handles,
	// so that update events during the delay start no second worker.
	inFlight map[string]bool
}

// settled reports whether a VolumeAttachment needs no more work.
func settled(va *storagev1.VolumeAttachment) bool {
	return va.Status.Attached || va.Status.AttachError != nil || va.DeletionTimestamp != nil
}

// consider starts a worker for va if it is ours and unsettled.
func (a *fakeAttacher) consider(ctx context.Context, va *storagev1.VolumeAttachment) {
	if settled(va) || (a.opts.Driver != "" && va.Spec.Attacher != a.opts.Driver) {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.inFlight[va.Name] || ctx.Err() != nil {
		return
	}
	a.inFlight[va.Name] = true
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		defer func() {
			a.mu.Lock()
			delete(a.inFlight, va.Name)
			a.mu.Unlock()
		}()
		if err := a.attach(ctx, va.Name); err != nil && ctx.Err() == nil {
			klog.FromContext(ctx).Error(err, "Setting VolumeAttachment status", "volumeAttachment", va.Name)
		}
	}()
}

// attach waits for the delay and writes the status, reading the object
// afresh from the API so that a stale informer event cannot overwrite a
// newer status.
func (a *fakeAttacher) attach(ctx context.Context, name string) error {
	if a.opts.Delay > 0 {
		select {
		case <-a.opts.Clock.After(a.opts.Delay):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	vas := a.client.StorageV1().VolumeAttachments()
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		va, err := vas.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if settled(va) {
			return nil
		}
		pvName := ""
		if va.Spec.Source.PersistentVolumeName != nil {
			pvName = *va.Spec.Source.PersistentVolumeName
		}
		if msg, fail := a.opts.Fail[pvName]; fail && pvName != "" {
			va.Status.AttachError = &storagev1.VolumeError{Time: metav1.Now(), Message: msg}
		} else {
			va.Status.Attached = true
			va.Status.AttachmentMetadata = maps.Clone(a.opts.Metadata)
			va.Status.AttachError = nil
		}
		_, err = vas.UpdateStatus(ctx, va, metav1.UpdateOptions{})
		return err
	})
}

// control makes the attacher play the attach/detach controller for
// opts.Node, once factory has started: PVs are considered only after the
// CSIDrivers have been listed (a PV seen before its CSIDriver would
// otherwise be attached wrongly), and again when a CSIDriver changes.
func (a *fakeAttacher) control(ctx context.Context, factory informers.SharedInformerFactory) (start func() error, err error) {
	drivers := factory.Storage().V1().CSIDrivers()
	pvInformer := factory.Core().V1().PersistentVolumes().Informer()
	onPV := func(obj any) {
		if pv, ok := obj.(*v1.PersistentVolume); ok {
			a.control1(ctx, drivers.Lister().Get, pv)
		}
	}
	var ready atomic.Bool
	onDriver := func(any) {
		if !ready.Load() {
			return // the PV handler's initial adds will see it
		}
		for _, obj := range pvInformer.GetStore().List() {
			onPV(obj)
		}
	}
	if _, err := drivers.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: onDriver, UpdateFunc: func(_, obj any) { onDriver(obj) },
	}); err != nil {
		return nil, fmt.Errorf("csitest: watching CSIDrivers: %w", err)
	}
	return func() error {
		if !cache.WaitForCacheSync(ctx.Done(), drivers.Informer().HasSynced) {
			return ctx.Err()
		}
		ready.Store(true)
		// Added after the start: it gets every PV listed so far as an add.
		_, err := pvInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    onPV,
			UpdateFunc: func(_, obj any) { onPV(obj) },
			DeleteFunc: func(obj any) {
				if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
					obj = t.Obj
				}
				if pv, ok := obj.(*v1.PersistentVolume); ok && pv.Spec.CSI != nil {
					a.run(ctx, func() error { return detachVolume(ctx, a.client, pv, a.opts.Node) })
				}
			},
		})
		if err != nil {
			return fmt.Errorf("csitest: watching PersistentVolumes: %w", err)
		}
		return nil
	}, nil
}

// control1 creates pv's VolumeAttachment if its driver needs attaching.
func (a *fakeAttacher) control1(ctx context.Context, driver func(string) (*storagev1.CSIDriver, error), pv *v1.PersistentVolume) {
	if pv.Spec.CSI == nil || pv.DeletionTimestamp != nil || (a.opts.Driver != "" && pv.Spec.CSI.Driver != a.opts.Driver) {
		return
	}
	if d, err := driver(pv.Spec.CSI.Driver); err == nil && d.Spec.AttachRequired != nil && !*d.Spec.AttachRequired {
		return
	}
	a.run(ctx, func() error {
		_, err := AttachVolume(ctx, a.client, pv, a.opts.Node)
		return err
	})
}

// run runs fn on a worker the attacher waits for, and logs its error.
func (a *fakeAttacher) run(ctx context.Context, fn func() error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ctx.Err() != nil {
		return
	}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		if err := fn(); err != nil && ctx.Err() == nil {
			klog.FromContext(ctx).Error(err, "Playing the attach/detach controller", "node", a.opts.Node)
		}
	}()
}

// AttachVolume plays the attach-detach controller: it creates the
// VolumeAttachment of a CSI PV on node (see volumeAttachmentFor), for the
// fake attacher to attach. If it exists already it returns the existing
// one.
func AttachVolume(ctx context.Context, client kubernetes.Interface, pv *v1.PersistentVolume, node string) (*storagev1.VolumeAttachment, error) {
	va, err := volumeAttachmentFor(pv, node)
	if err != nil {
		return nil, err
	}
	vas := client.StorageV1().VolumeAttachments()
	created, err := vas.Create(ctx, va, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return vas.Get(ctx, va.Name, metav1.GetOptions{})
	}
	return created, err
}

// detachVolume plays the attach-detach controller detaching a CSI PV from
// node: it deletes the VolumeAttachment. A missing one is not an error.
func detachVolume(ctx context.Context, client kubernetes.Interface, pv *v1.PersistentVolume, node string) error {
	va, err := volumeAttachmentFor(pv, node)
	if err != nil {
		return err
	}
	err = client.StorageV1().VolumeAttachments().Delete(ctx, va.Name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// volumeAttachmentFor returns the unattached VolumeAttachment that the
// attach-detach controller creates for a CSI volume on node, named as the
// kubelet expects. It fails if pv has no CSI source.
func volumeAttachmentFor(pv *v1.PersistentVolume, node string) (*storagev1.VolumeAttachment, error) {
	src := pv.Spec.CSI
	if src == nil {
		return nil, fmt.Errorf("csitest: persistent volume %s has no CSI source", pv.Name)
	}
	return VolumeAttachment(attachmentName(src.VolumeHandle, src.Driver, node), src.Driver, pv.Name, node, false), nil
}
