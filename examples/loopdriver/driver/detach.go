package driver

import (
	"context"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
)

// Detaching a loop device is not always done when LOOP_CLR_FD returns.
// If anything else has the device open at that moment (udev or blkid
// probing it, another losetup --associated, which opens every attached
// loop device to compare backing files), the kernel only marks it
// (autoclear) and detaches it at its last close. Until then the device
// is still attached to the image: Find lists it, and a NodeStageVolume
// that reused it would hand out a device that goes away under it. So
// every call that detaches waits until the devices are gone, and every
// call that finds devices being detached waits for them too; none
// trusts a successful Detach alone.

// Backoff between two looks at devices being detached.
const (
	detachPollFirst = time.Millisecond
	detachPollMax   = 100 * time.Millisecond
)

// requestDetach detaches devs, which Find returned for image, except
// those already being detached. The caller waits for them to go with
// awaitDetached.
func (d *server) requestDetach(ctx context.Context, id, image string, devs []string) error {
	for _, dev := range devs {
		pending, err := d.loop.Detaching(ctx, dev)
		if err != nil {
			return status.Errorf(codes.Internal, "volume %s: %v", id, err)
		}
		if pending {
			continue
		}
		if err := d.loop.Detach(ctx, dev); err != nil {
			// A detach the kernel had deferred may have finished since
			// Find: then the device is gone, which is what was asked.
			found, ferr := d.loop.Find(ctx, image)
			if ferr != nil || slices.Contains(found, dev) {
				return status.Errorf(codes.Internal, "volume %s: %v", id, err)
			}
		}
	}
	return nil
}

// skipDetaching waits for those of devs (found for image) that are being
// detached to go away and returns the others, which are usable. It fails
// like awaitDetached if they do not go away in time.
func (d *server) skipDetaching(ctx context.Context, id, image string, devs []string) ([]string, error) {
	var pending, usable []string
	for _, dev := range devs {
		p, err := d.loop.Detaching(ctx, dev)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "volume %s: %v", id, err)
		}
		if p {
			pending = append(pending, dev)
		} else {
			usable = append(usable, dev)
		}
	}
	if len(pending) > 0 {
		if err := d.awaitDetached(ctx, id, image, pending); err != nil {
			return nil, err
		}
	}
	return usable, nil
}

// awaitDetached waits, with a short backoff, until Find no longer lists
// any of devs for image, at most d.detachWait and while ctx lasts. It
// fails with Unavailable if they are still there then: a retry finds
// and waits for them again.
func (d *server) awaitDetached(ctx context.Context, id, image string, devs []string) error {
	if len(devs) == 0 {
		return nil
	}
	start := time.Now()
	deadline := start.Add(d.detachWait)
	delay := detachPollFirst
	for looks := 1; ; looks++ {
		found, err := d.loop.Find(ctx, image)
		if err != nil {
			return status.Errorf(codes.Internal, "volume %s: %v", id, err)
		}
		var left []string
		for _, dev := range devs {
			if slices.Contains(found, dev) {
				left = append(left, dev)
			}
		}
		if len(left) == 0 {
			if looks > 1 {
				klog.FromContext(ctx).V(2).Info("Loop devices were detached only after their last close", "devices", devs, "waited", time.Since(start), "looks", looks)
			}
			return nil
		}
		var why string
		if time.Now().After(deadline) {
			why = "after " + d.detachWait.String()
		} else {
			t := time.NewTimer(delay)
			select {
			case <-t.C:
				delay = min(2*delay, detachPollMax)
				continue
			case <-ctx.Done():
				t.Stop()
				why = "when the call ended (" + ctx.Err().Error() + ")"
			}
		}
		return status.Errorf(codes.Unavailable, "volume %s: loop devices %v are still being detached %s: something else has them open and the kernel detaches them at the last close; retry", id, left, why)
	}
}
