package registration

import (
	"context"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/nodevol/nodevol/internal/duequeue"
)

// refresher keeps the allocatable count of each registered driver's CSINode
// entry current, as the kubelet does with MutableCSINodeAllocatableCount:
// every nodeAllocatableUpdatePeriodSeconds of the driver's CSIDriver, and
// at once after a VolumeAttachment, a NodeStageVolume or a
// NodePublishVolume that failed with ResourceExhausted (Handler's
// ResourceExhausted). A driver whose CSIDriver sets no period is never
// refreshed; a deregistered one no longer. One goroutine (run) does every refresh; the others only kick it.
type refresher struct {
	h          *Handler
	csiDrivers storagelisters.CSIDriverLister
	clock      clock.Clock

	mu        sync.Mutex
	exhausted map[string]bool
	kickC     chan struct{}

	// Owned by run.
	next *duequeue.Queue[string]
	// period is each scheduled driver's period (the drivers in next);
	// badPeriod the error last logged for a driver, so that it is logged
	// once.
	period    map[string]time.Duration
	badPeriod map[string]string
}

func newRefresher(h *Handler, csiDrivers storagelisters.CSIDriverLister, c clock.Clock) *refresher {
	if c == nil {
		c = clock.RealClock{}
	}
	return &refresher{
		h: h, csiDrivers: csiDrivers, clock: c,
		exhausted: map[string]bool{}, kickC: make(chan struct{}, 1),
		next: duequeue.New[string](c), period: map[string]time.Duration{}, badPeriod: map[string]string{},
	}
}

// kick makes run look at the drivers and their CSIDrivers again.
func (r *refresher) kick() {
	select {
	case r.kickC <- struct{}{}:
	default:
	}
}

// resourceExhausted asks for a refresh of driver's count at once.
func (r *refresher) resourceExhausted(driver string) {
	r.mu.Lock()
	r.exhausted[driver] = true
	r.mu.Unlock()
	r.kick()
}

// run refreshes until ctx ends.
func (r *refresher) run(ctx context.Context) {
	defer r.next.Stop()
	for {
		r.sync(ctx)
		r.next.Arm()
		select {
		case <-ctx.Done():
			return
		case <-r.kickC:
		case <-r.next.C():
			r.next.Fired()
		}
	}
}

// sync schedules the registered drivers by their CSIDrivers' periods,
// refreshes those that are due or exhausted, and returns the earliest
// next refresh (zero: none).
func (r *refresher) sync(ctx context.Context) time.Time {
	logger := klog.FromContext(ctx)
	now := r.clock.Now()
	r.mu.Lock()
	exhausted := r.exhausted
	r.exhausted = map[string]bool{}
	r.mu.Unlock()
	registered := r.h.registered()
	for name := range r.period {
		if !slices.Contains(registered, name) {
			r.next.Remove(name)
			delete(r.period, name)
		}
	}
	for _, name := range registered {
		period := r.periodOf(logger, name)
		if period == 0 {
			r.next.Remove(name)
			delete(r.period, name)
			continue
		}
		if r.period[name] != period {
			// Newly registered, or the period changed: the count was read
			// at registration, so the first refresh is one period away.
			r.period[name] = period
			r.next.Set(name, now.Add(period))
		}
		next, _ := r.next.At(name)
		if exhausted[name] || !now.Before(next) {
			r.refresh(ctx, name)
			if !now.Before(next) {
				r.next.Set(name, now.Add(period))
			}
		}
	}
	return r.next.Next()
}

// periodOf is the driver's refresh period (0: none); an invalid one is
// logged once per value.
func (r *refresher) periodOf(logger klog.Logger, name string) time.Duration {
	d, err := r.csiDrivers.Get(name)
	if apierrors.IsNotFound(err) {
		d, err = nil, nil
	}
	if err == nil {
		var period time.Duration
		if period, err = allocatableUpdatePeriod(d); err == nil {
			delete(r.badPeriod, name)
			return period
		}
	}
	if r.badPeriod[name] != err.Error() {
		r.badPeriod[name] = err.Error()
		logger.Error(err, "Not refreshing the CSINode allocatable count of CSI driver", "driver", name)
	}
	return 0
}

// refresh asks the driver for its node information and records its
// allocatable count in the CSINode. Failures are logged; the next period
// tries again.
func (r *refresher) refresh(ctx context.Context, name string) {
	logger := klog.FromContext(ctx)
	client, err := r.h.registry.Client(name)
	if err != nil {
		logger.Error(err, "Refreshing the CSINode allocatable count", "driver", name)
		return
	}
	info, err := client.NodeGetInfo(ctx)
	if err == nil {
		err = r.h.nodeInfo.updateAllocatable(ctx, name, info)
	}
	if err != nil {
		logger.Error(err, "Refreshing the CSINode allocatable count", "driver", name)
		return
	}
	logger.V(4).Info("Refreshed the CSINode allocatable count", "driver", name, "count", info.MaxVolumesPerNode)
}
