package registration

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/csi"
)

// ControllerManagedAttachDetachAnnotation on a Node tells the attach/detach
// controller that it attaches and detaches the node's volumes. The
// controller looks only at its presence: without it, it never attaches a
// volume to the node, and the node must do it itself (self-attach mode).
const ControllerManagedAttachDetachAnnotation = "volumes.kubernetes.io/controller-managed-attach-detach"

// SetNodeAttachMode sets node's ControllerManagedAttachDetachAnnotation as
// the kubelet does when it registers or updates its Node: "true" when the
// attach/detach controller attaches the node's volumes, absent when the
// node attaches them itself (selfAttach). It reports whether it changed
// node. A node agent calls it on the Node it creates or updates.
func SetNodeAttachMode(node *corev1.Node, selfAttach bool) bool {
	value, ok := node.Annotations[ControllerManagedAttachDetachAnnotation]
	if selfAttach {
		if !ok {
			return false
		}
		delete(node.Annotations, ControllerManagedAttachDetachAnnotation)
		return true
	}
	if ok && value == "true" {
		return false
	}
	if node.Annotations == nil {
		node.Annotations = map[string]string{}
	}
	node.Annotations[ControllerManagedAttachDetachAnnotation] = "true"
	return true
}

// minAllocatableUpdatePeriod is the shortest nodeAllocatableUpdatePeriodSeconds
// the API server accepts in a CSIDriver.
const minAllocatableUpdatePeriod = 10 * time.Second

// allocatableUpdatePeriod returns how often the node refreshes the
// driver's allocatable count in its CSINode entry: the CSIDriver's
// nodeAllocatableUpdatePeriodSeconds, or 0 when the CSIDriver (or the
// field) is missing, which means never (neither periodically nor after a
// ResourceExhausted), as in the kubelet. A value the API server would
// refuse (below 10 seconds, or too large for a time.Duration) is an error:
// no refresh runs then.
func allocatableUpdatePeriod(d *storagev1.CSIDriver) (time.Duration, error) {
	if d == nil || d.Spec.NodeAllocatableUpdatePeriodSeconds == nil {
		return 0, nil
	}
	s := *d.Spec.NodeAllocatableUpdatePeriodSeconds
	if s < int64(minAllocatableUpdatePeriod/time.Second) || s > math.MaxInt64/int64(time.Second) {
		return 0, fmt.Errorf("CSIDriver %s: nodeAllocatableUpdatePeriodSeconds %d is out of range (at least %d seconds): its allocatable count is not refreshed",
			d.Name, s, int64(minAllocatableUpdatePeriod/time.Second))
	}
	return time.Duration(s) * time.Second, nil
}

// errNodeNotRegistered is wrapped by initCSINode while the node's Node
// object does not exist: at a node's first start the kubelet registers it
// beside the volume manager, so this is a wait, not a failure.
var errNodeNotRegistered = errors.New("its Node is not registered yet")

// initCSINode creates the node's CSINode, owned by the Node, with no
// driver and the migrated-plugins annotation, unless it exists, as the kubelet does at start before any driver
// registers (the scheduler and the attach/detach controller read it).
func (n *nodeInfo) initCSINode(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	node, err := n.client.CoreV1().Nodes().Get(ctx, n.nodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("initializing CSINode %s: %w: %w", n.nodeName, errNodeNotRegistered, err)
	}
	if err != nil {
		return fmt.Errorf("initializing CSINode %s: reading its Node: %w", n.nodeName, err)
	}
	// The kubelet creates it with the migrated-plugins annotation: the
	// attach/detach controller reads it to decide how to attach in-tree
	// volumes on this node.
	if err := n.updateCSINode(ctx, node, func(cn *storagev1.CSINode) { migratedPluginsAnnotation(cn) }); err != nil {
		return fmt.Errorf("initializing CSINode %s: %w", n.nodeName, err)
	}
	klog.FromContext(ctx).V(2).Info("CSINode initialized", "node", n.nodeName)
	return nil
}

// updateAllocatable sets the allocatable count of driver's CSINode entry
// to info.MaxVolumesPerNode (none when 0). A driver without an entry (not
// installed, or uninstalled meanwhile) is left out.
func (n *nodeInfo) updateAllocatable(ctx context.Context, driver string, info csi.NodeInfo) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	alloc := csiNodeDriver(driver, info).Allocatable
	err := n.updateCSINode(ctx, nil, func(cn *storagev1.CSINode) {
		for i := range cn.Spec.Drivers {
			if cn.Spec.Drivers[i].Name == driver {
				cn.Spec.Drivers[i].Allocatable = alloc
			}
		}
	})
	if err != nil {
		return fmt.Errorf("updating the allocatable count of CSI driver %s in CSINode %s: %w", driver, n.nodeName, err)
	}
	return nil
}
