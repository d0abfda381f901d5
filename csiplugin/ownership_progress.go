package csiplugin

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/cache"
)

// DefaultPermissionChangeWarnAfter is how long an fsGroup ownership change
// runs before it is reported: the kubelet's 30 seconds.
const DefaultPermissionChangeWarnAfter = 30 * time.Second

// ReasonPermissionChangeInProgress is the reason of the event recorded on a
// pod whose volume's ownership change runs long, the kubelet's.
const ReasonPermissionChangeInProgress = "VolumePermissionChangeInProgress"

// changeOwnership gives the pod's fsGroup ownership of its published volume
// d (setOwnershipOf). When that runs longer than p.warnAfter, it logs a
// warning and records a VolumePermissionChangeInProgress event on the pod,
// once, as the kubelet does: a volume with many files can keep a pod from
// starting for a long time, and the event tells its owner why and what
// avoids it. It returns only once the reporting goroutine has ended.
func (p *Plugin) changeOwnership(ctx context.Context, d *os.File, vol cache.PodVolume) error {
	gid := *vol.FSGroup
	var files atomic.Int64
	timer := p.clock.NewTimer(p.warnAfter)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-done:
			return
		case <-timer.C():
		}
		n := files.Load()
		klog.FromContext(ctx).Info("Changing the ownership of a volume to the pod's fsGroup is taking long; fsGroupChangePolicy OnRootMismatch would skip it when the volume's root already has the group",
			"pod", klog.KRef(vol.Pod.Namespace, vol.Pod.Name), "volume", vol.SpecName, "path", d.Name(), "fsGroup", gid, "after", p.warnAfter, "files", n)
		if p.events == nil {
			return
		}
		ref := &v1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: vol.Pod.Namespace, Name: vol.Pod.Name, UID: vol.Pod.UID}
		p.events.Event(ref, v1.EventTypeWarning, ReasonPermissionChangeInProgress, fmt.Sprintf(
			"Setting volume ownership of volume %q to fsGroup %d has taken more than %s (%d files so far); consider fsGroupChangePolicy: OnRootMismatch",
			vol.SpecName, gid, p.warnAfter, n))
	})
	err := setOwnershipCounting(ctx, d, gid, vol.FSGroupOnRootMismatch, func(path string) {
		files.Add(1)
		if p.eachOwnedFile != nil {
			p.eachOwnedFile(path)
		}
	})
	timer.Stop()
	close(done)
	wg.Wait()
	return err
}
