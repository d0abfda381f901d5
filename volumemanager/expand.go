package volumemanager

import (
	"context"
	"errors"
	"fmt"

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

// opResize is the operation name of a node expansion, the kubelet's.
const opResize = "volume_fs_resize"

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

// checkExpansion starts the node expansion of claim namespace/name if its
// volume is mounted here and needs it, as the kubelet does for online
// expansion. A failure is retried at the next resync, after the backoff.
func (vm *VolumeManager) checkExpansion(ctx context.Context, namespace, name string) {
	if vm.expander == nil {
		return
	}
	pvc, err := vm.resolver.pvcs.PersistentVolumeClaims(namespace).Get(name)
	if err != nil || pvc.Spec.VolumeName == "" {
		return
	}
	pv, err := vm.resolver.pvs.Get(pvc.Spec.VolumeName)
	if err != nil || pv.Spec.CSI == nil || !needsNodeExpansion(pvc, pv) {
		return
	}
	volName := cache.CSIVolumeName(pv.Spec.CSI.Driver, pv.Spec.CSI.VolumeHandle)
	spec, pods, wanted := vm.dsw.Volume(volName)
	actual, known := vm.asw.Volume(volName)
	if !wanted || !known || spec.Mode == cache.Block {
		return
	}
	// Online expansion needs the volume published somewhere; a volume that
	// is not yet is expanded once it is (the publish enqueues no expansion,
	// but the resync checks again).
	var path string
	for _, pm := range actual.Pods {
		if pm.State == cache.Mounted {
			path = pm.Path
			break
		}
	}
	if path == "" || (actual.DeviceMountPath != "" && actual.DeviceState != cache.Mounted) {
		return
	}
	size := pv.Spec.Capacity[v1.ResourceStorage]
	logger := klog.FromContext(ctx).WithValues("pvc", klog.KObj(pvc), "volume", volName, "driver", spec.Driver, "size", size.String())
	op := oe.Operation{
		Key:  oe.Key{Volume: volName},
		Name: opResize,
		Fn: func(ctx context.Context) error {
			expanded, err := vm.expander.NodeExpand(ctx, csiplugin.ExpandRequest{Spec: &spec, VolumePath: path, StagingPath: actual.DeviceMountPath, Size: size.Value()})
			if err != nil {
				return err
			}
			if err := vm.markExpanded(ctx, pvc.Namespace, pvc.Name, pv.Name, size.DeepCopy()); err != nil {
				return fmt.Errorf("volume %s expanded on the node, but updating PVC %s/%s failed: %w", volName, pvc.Namespace, pvc.Name, err)
			}
			logger.V(2).Info("Volume expanded on the node", "expanded", expanded)
			return nil
		},
		Done: func(err error) {
			reason, kind, msg := "FileSystemResizeSuccessful", v1.EventTypeNormal, fmt.Sprintf("NodeExpandVolume succeeded for volume %q to %s", pv.Name, size.String())
			if err != nil {
				reason, kind, msg = "FileSystemResizeFailed", v1.EventTypeWarning, err.Error()
				logger.Error(err, "Expanding volume on the node failed")
			}
			vm.podEvents(pods, kind, reason, msg)
		},
	}
	err = vm.rec.exec.Run(ctx, op)
	var be *oe.BackoffError
	if err != nil && !errors.Is(err, oe.ErrBusy) && !errors.As(err, &be) {
		logger.Error(err, "Cannot start node expansion")
	}
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

// checkAllExpansions checks every claim of a desired volume (at resync).
func (vm *VolumeManager) checkAllExpansions(ctx context.Context) {
	if vm.expander == nil {
		return
	}
	for _, name := range vm.dsw.VolumeNames() {
		spec, _, ok := vm.dsw.Volume(name)
		if !ok || spec.PVName == "" {
			continue
		}
		pv, err := vm.resolver.pvs.Get(spec.PVName)
		if err != nil || pv.Spec.ClaimRef == nil {
			continue
		}
		vm.checkExpansion(ctx, pv.Spec.ClaimRef.Namespace, pv.Spec.ClaimRef.Name)
	}
}
