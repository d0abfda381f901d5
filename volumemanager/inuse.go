package volumemanager

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/nodevol/nodevol/internal/backoff"
	"github.com/nodevol/nodevol/podvol"
)

// inUseRetry is the backoff of a failed Node status patch, with jitter:
// after an API server outage the nodes do not all patch at once.
var inUseRetry = backoff.Policy{Initial: 500 * time.Millisecond, Max: 30 * time.Second, Jitter: backoff.APIJitter}

// inUseReporter keeps Node.Status.VolumesInUse equal to the volumes the
// manager may use, as the kubelet's node status does, and tells which
// volumes have been reported: the attach/detach controller does not detach
// a volume reported in use, so a volume that needs attaching is confirmed
// attached (and then staged) only once reported (kubelet's reportedInUse).
type inUseReporter struct {
	client kubernetes.Interface
	node   string
	// attachable reports whether a volume is attached before it is staged
	// (its plugin's Capabilities.Attachable; true when they are not known
	// yet): only those wait to be reported.
	attachable func(spec *podvol.VolumeSpec) bool
	clock      clock.Clock
	retry      backoff.Policy
	inUse      func() []podvol.UniqueVolumeName
	reported   func(names []podvol.UniqueVolumeName) // volumes newly reported
	// byCaller: the caller patches the Node and tells what it reported
	// (markReported); run is not started.
	byCaller bool

	kick chan struct{}

	mu   sync.Mutex
	last map[podvol.UniqueVolumeName]bool // what the Node says, after our last patch
	sent bool                             // a patch succeeded at least once
	// failed is the error of the last report, nil after a success: the
	// wait errors of held volumes quote it.
	failed error
}

func newInUseReporter(client kubernetes.Interface, node string, attachable func(spec *podvol.VolumeSpec) bool, clk clock.Clock) *inUseReporter {
	return &inUseReporter{client: client, node: node, attachable: attachable, clock: clk, retry: inUseRetry, kick: make(chan struct{}, 1)}
}

// changed asks for a report: the set of volumes in use may have changed.
// It never blocks.
func (r *inUseReporter) changed() {
	if r == nil {
		return
	}
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// hold reports whether an attachable volume must wait before its
// attachment is confirmed: it has not been reported in use yet. The
// planner asks only for volumes whose Capabilities say Attachable.
func (r *inUseReporter) hold(name podvol.UniqueVolumeName) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.last[name]
}

// waiting says, for a volume that hold keeps waiting, what it waits for
// and why the report has not happened yet (the last patch's error), for
// the wait errors; "" when the volume is not held or needs no attaching.
func (r *inUseReporter) waiting(spec *podvol.VolumeSpec) string {
	if r == nil || !r.hold(spec.Name) || !r.attachable(spec) {
		return ""
	}
	r.mu.Lock()
	failed := r.failed
	r.mu.Unlock()
	why := fmt.Sprintf("its attachment is confirmed only once node %s's status.volumesInUse lists it", r.node)
	if failed != nil {
		return fmt.Sprintf("%s, and reporting it failed: %v", why, failed)
	}
	return why + ", which has not been reported yet"
}

// run reports until ctx ends.
func (r *inUseReporter) run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	retry := backoff.NewTimer(r.clock)
	defer retry.Stop()
	failures := 0
	r.changed()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		case <-retry.C():
		}
		retry.Stop()
		err := r.report(ctx)
		r.mu.Lock()
		r.failed = err
		r.mu.Unlock()
		if err != nil {
			failures++
			wait := r.retry.Delay(failures)
			logger.Error(err, "Reporting volumes in use on the Node failed, retrying", "node", r.node, "retryAfter", wait)
			retry.After(wait)
			continue
		}
		failures = 0
	}
}

// report patches the Node's status if the volumes in use changed.
func (r *inUseReporter) report(ctx context.Context) error {
	names := r.inUse()
	r.mu.Lock()
	same := r.sent && len(names) == len(r.last)
	for _, n := range names {
		same = same && r.last[n]
	}
	r.mu.Unlock()
	if same {
		return nil
	}
	list := make([]v1.UniqueVolumeName, 0, len(names))
	for _, n := range names {
		list = append(list, v1.UniqueVolumeName(n))
	}
	slices.Sort(list)
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"volumesInUse": list}})
	if err != nil {
		return fmt.Errorf("encoding the volumesInUse patch of node %s: %w", r.node, err)
	}
	_, err = r.client.CoreV1().Nodes().Patch(ctx, r.node, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil {
		if apierrors.IsNotFound(err) {
			klog.FromContext(ctx).V(2).Info("Node not found, volumes in use not reported yet", "node", r.node)
		}
		return fmt.Errorf("patching status.volumesInUse of node %s: %w", r.node, err)
	}
	now := make(map[podvol.UniqueVolumeName]bool, len(names))
	var added []podvol.UniqueVolumeName
	r.mu.Lock()
	for _, n := range names {
		now[n] = true
		if !r.last[n] {
			added = append(added, n)
		}
	}
	r.last, r.sent = now, true
	r.mu.Unlock()
	if len(added) > 0 && r.reported != nil {
		r.reported(added)
	}
	return nil
}

// markReported records names as the volumes the Node's status.volumesInUse
// lists, as the caller that keeps it reports them
// (Config.VolumesInUseReportedByCaller): the set replaces the previous one,
// as the kubelet's MarkVolumesAsReportedInUse does, and the newly listed
// volumes are retried at once.
func (r *inUseReporter) markReported(names []podvol.UniqueVolumeName) {
	now := make(map[podvol.UniqueVolumeName]bool, len(names))
	var added []podvol.UniqueVolumeName
	r.mu.Lock()
	for _, n := range names {
		if !now[n] && !r.last[n] {
			added = append(added, n)
		}
		now[n] = true
	}
	r.last, r.sent = now, true
	r.mu.Unlock()
	if len(added) > 0 && r.reported != nil {
		r.reported(added)
	}
}
