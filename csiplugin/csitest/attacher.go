package csitest

import (
	"context"
	"fmt"
	"maps"
	"sync"
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
// It does not create VolumeAttachments: on a real cluster the attach-detach
// controller does, or the node itself in self-attach mode
// (volumemanager.Config.SelfAttach), whose VolumeAttachments it attaches
// like any other. Tests that want the controller's role too call
// AttachVolume for each PV and node.
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
	factory.Start(ctx.Done())
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

// AttachVolume plays the attach-detach controller: it creates the
// VolumeAttachment of a CSI PV on node (see VolumeAttachmentFor), for the
// fake attacher to attach. If it exists already it returns the existing
// one.
func AttachVolume(ctx context.Context, client kubernetes.Interface, pv *v1.PersistentVolume, node string) (*storagev1.VolumeAttachment, error) {
	va, err := VolumeAttachmentFor(pv, node)
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

// DetachVolume plays the attach-detach controller detaching a CSI PV from
// node: it deletes the VolumeAttachment. A missing one is not an error.
func DetachVolume(ctx context.Context, client kubernetes.Interface, pv *v1.PersistentVolume, node string) error {
	va, err := VolumeAttachmentFor(pv, node)
	if err != nil {
		return err
	}
	err = client.StorageV1().VolumeAttachments().Delete(ctx, va.Name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
