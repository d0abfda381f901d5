package volumemanager

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/volumemanager/internal/reconciler"
)

// operationContext returns the context operations run with. It is ctx
// (Run's) without its cancellation, cancelled ShutdownGracePeriod after
// ctx ends, or by stop: an operation in flight at shutdown, a NodeStage
// or a NodeUnpublish half done, gets the grace period to finish instead
// of being cut off and left Uncertain for the next start. With no grace
// period it is ctx itself.
func (vm *VolumeManager) operationContext(ctx context.Context) (opCtx context.Context, stop func()) {
	grace := vm.cfg.ShutdownGracePeriod
	if grace <= 0 {
		return ctx, func() {}
	}
	opCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		select {
		case <-ctx.Done():
		case <-opCtx.Done():
			return
		}
		klog.FromContext(ctx).Info("Stopping: no new operation starts, those in flight may finish", "gracePeriod", grace)
		t := vm.cfg.Clock.NewTimer(grace)
		defer t.Stop()
		select {
		case <-t.C():
			klog.FromContext(ctx).Info("Shutdown grace period over: cancelling the operations still in flight", "gracePeriod", grace)
			cancel()
		case <-opCtx.Done():
		}
	}()
	return opCtx, cancel
}

// Healthy reports whether Run is running and making progress, for a
// liveness probe: nil once Run has read what earlier runs left on disk,
// every informer has listed once, and the reconcile loop takes a request
// before ctx ends. Otherwise an error that says which of these is not so:
// Run not called yet, Run's context done (stopping or stopped), informers
// not synced, or the loop busy beyond ctx (stuck).
func (vm *VolumeManager) Healthy(ctx context.Context) error {
	p := vm.runCtx.Load()
	if p == nil {
		return errors.New("volume manager not running: Run has not been called")
	}
	if err := (*p).Err(); err != nil {
		return fmt.Errorf("volume manager stopping or stopped: %w", err)
	}
	if !vm.informersSynced() {
		return errors.New("volume manager informers have not synced yet")
	}
	// The loop takes inspect requests only once it has read the disk, and
	// between two steps: an answer means it is not stuck.
	select {
	case vm.inspect <- func(*reconciler.Loop) {}:
		return nil
	case <-(*p).Done():
		return fmt.Errorf("volume manager stopping or stopped: %w", (*p).Err())
	case <-ctx.Done():
		return fmt.Errorf("volume manager reconcile loop did not answer (stuck, or still reading the disk): %w", ctx.Err())
	}
}
