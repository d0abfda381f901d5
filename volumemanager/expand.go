package volumemanager

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/cache"
	"github.com/nodevol/nodevol/csiplugin"
	oe "github.com/nodevol/nodevol/operationexecutor"
)

// nodeExpander grows mounted volumes on the node (csiplugin.Plugin).
type nodeExpander interface {
	NodeExpand(ctx context.Context, req csiplugin.ExpandRequest) (bool, error)
}

// needsNodeExpansion reports whether the controller has grown pv beyond
// what its claim reports and left the rest to the node: the claim's
// status capacity is smaller than the PV's, and the claim says the node's
// part is pending (the FileSystemResizePending condition, or the
// NodeResizePending allocated resource status).
func needsNodeExpansion(pvc *v1.PersistentVolumeClaim, pv *v1.PersistentVolume) bool {
	want, ok := pv.Spec.Capacity[v1.ResourceStorage]
	if !ok || want.IsZero() {
		return false
	}
	have := pvc.Status.Capacity[v1.ResourceStorage]
	if have.Cmp(want) >= 0 {
		return false
	}
	if pvc.Status.AllocatedResourceStatuses[v1.ResourceStorage] == v1.PersistentVolumeClaimNodeResizePending {
		return true
	}
	for _, c := range pvc.Status.Conditions {
		if c.Type == v1.PersistentVolumeClaimFileSystemResizePending && c.Status == v1.ConditionTrue {
			return true
		}
	}
	return false
}

// pendingExpansion returns the node expansion pending for PV pvName's claim
// (read through the listers), for the planner.
func (r *resolver) pendingExpansion(pvName string) (expansion, bool) {
	pv, err := r.pvs.Get(pvName)
	if err != nil || pv.Spec.CSI == nil || pv.Spec.ClaimRef == nil {
		return expansion{}, false
	}
	pvc, err := r.pvcs.PersistentVolumeClaims(pv.Spec.ClaimRef.Namespace).Get(pv.Spec.ClaimRef.Name)
	if err != nil || pvc.Spec.VolumeName != pv.Name || !needsNodeExpansion(pvc, pv) {
		return expansion{}, false
	}
	size := pv.Spec.Capacity[v1.ResourceStorage]
	return expansion{Size: size.Value(), Namespace: pvc.Namespace, Claim: pvc.Name, PV: pv.Name}, true
}

// expand runs a node expansion the planner asked for: NodeExpandVolume,
// then the claim's status, then an event on the volume's pods.
func (vm *VolumeManager) expand(ctx context.Context, a oe.Action, in opInput) oe.Outcome {
	spec, e := in.Spec, in.Expansion
	out := oe.Outcome{Action: a, Spec: spec}
	start := time.Now()
	size := *resource.NewQuantity(e.Size, resource.BinarySI)
	logger := klog.FromContext(ctx).WithValues("pvc", klog.KRef(e.Namespace, e.Claim), "volume", spec.Name, "driver", spec.Driver, "size", size.String())
	expanded, err := vm.expander.NodeExpand(ctx, csiplugin.ExpandRequest{Spec: &spec, VolumePath: in.VolumePath, StagingPath: in.DeviceMountPath, Size: e.Size})
	if err == nil {
		if err = vm.markExpanded(ctx, e.Namespace, e.Claim, e.PV, size); err != nil {
			err = fmt.Errorf("volume expanded on the node, but updating PVC %s/%s failed: %w", e.Namespace, e.Claim, err)
		}
	}
	out.Duration = time.Since(start)
	_, pods, _ := vm.dsw.Volume(spec.Name)
	if err != nil {
		out.Err = oe.OpError(a, spec, err)
		return out // the loop logs it and records FileSystemResizeFailed
	}
	logger.V(2).Info("Volume expanded on the node", "expanded", expanded)
	vm.podEvents(pods, v1.EventTypeNormal, "FileSystemResizeSuccessful", fmt.Sprintf("NodeExpandVolume succeeded for volume %q to %s", e.PV, size.String()))
	return out
}

// markExpanded records a finished node expansion on the claim, as the
// kubelet does: status capacity set to the new size, FileSystemResizePending
// removed, the storage allocated resource status cleared.
func (vm *VolumeManager) markExpanded(ctx context.Context, namespace, name, pvName string, size resource.Quantity) error {
	claims := vm.cfg.KubeClient.CoreV1().PersistentVolumeClaims(namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pvc, err := claims.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if pvc.Spec.VolumeName != pvName {
			return nil // bound elsewhere meanwhile: not ours to update
		}
		if pvc.Status.Capacity == nil {
			pvc.Status.Capacity = v1.ResourceList{}
		}
		pvc.Status.Capacity[v1.ResourceStorage] = size
		conds := pvc.Status.Conditions[:0]
		for _, c := range pvc.Status.Conditions {
			if c.Type != v1.PersistentVolumeClaimFileSystemResizePending {
				conds = append(conds, c)
			}
		}
		pvc.Status.Conditions = conds
		delete(pvc.Status.AllocatedResourceStatuses, v1.ResourceStorage)
		if len(pvc.Status.AllocatedResourceStatuses) == 0 {
			pvc.Status.AllocatedResourceStatuses = nil
		}
		_, err = claims.UpdateStatus(ctx, pvc, metav1.UpdateOptions{})
		return err
	})
}

// podEvents records an event on each pod.
func (vm *VolumeManager) podEvents(pods []cache.PodVolume, kind, reason, msg string) {
	if vm.cfg.EventRecorder == nil {
		return
	}
	for _, p := range pods {
		ref := &v1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: p.Pod.Namespace, Name: p.Pod.Name, UID: p.Pod.UID}
		vm.cfg.EventRecorder.Event(ref, kind, reason, msg)
	}
}
