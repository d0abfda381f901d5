package volumemanager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/podvol"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
	"github.com/nodevol/nodevol/volumemanager/internal/planner"
	"github.com/nodevol/nodevol/volumemanager/internal/reconciler"

	"github.com/nodevol/nodevol/step"
	"github.com/nodevol/nodevol/volume"
)

// expand runs an online node expansion the planner asked for (a pod has
// the volume published).
func (vm *VolumeManager) expand(ctx context.Context, a oe.Action, in reconciler.Input) oe.Outcome {
	out := oe.Outcome{Action: a, Spec: in.Spec}
	start := time.Now()
	_, pods, _ := vm.dsw.Volume(in.Spec.Name)
	res, err := vm.nodeExpand(ctx, a, in, pods)
	out.Duration, out.Expansion = time.Since(start), res
	if err != nil {
		// The loop logs it, backs off and records VolumeResizeFailed.
		out.Err = oe.OpError(a, in.Spec, err)
	}
	return out
}

// expandAfterPublish grows the volume the publish out has just published,
// before the pod's mount counts as done, as the kubelet's MountVolume and
// MapVolume do (expandVolumeDuringMount): a pod started after the
// controller grew the volume sees the new size at once. When the expansion
// fails and will be retried, the mount is uncertain, so that the pod does
// not start on the old size and the publish (with the expansion) runs
// again after a backoff; a refused expansion leaves the mount done.
func (vm *VolumeManager) expandAfterPublish(ctx context.Context, a oe.Action, in reconciler.Input, out *oe.Outcome) {
	in.VolumePath = out.Path
	start := time.Now()
	res, err := vm.nodeExpand(ctx, a, in, []podvol.PodVolume{a.Pod})
	out.Duration += time.Since(start)
	out.Expansion = res
	if err != nil {
		out.Err = oe.OpError(a, in.Spec, &reconciler.ExpandError{Err: err})
		out.Uncertain = true
	}
}

// nodeExpand runs the kubelet's node expansion protocol for the claim's
// pending expansion in.Expansion, with pod a.Pod's publish:
//
//  1. read the claim; nothing to do if the expansion is no longer due on
//     this node at that size (planner.NodeExpansionDue: done elsewhere,
//     marked infeasible meanwhile, or its allocated size changed: see
//     planner.ExpansionTarget), and it is held until the claim's informer has a
//     newer version than it was planned with;
//  2. NodeResizePending becomes NodeResizeInProgress (a strategic merge
//     patch of the status, checked against the claim's resourceVersion);
//  3. NodeExpandVolume;
//  4. on success: the status capacity becomes the new size, the storage
//     resize status and the resize conditions are removed, and the pods
//     and the claim get FileSystemResizeSuccessful (expandedEvents);
//  5. on failure, see expandFailed.
//
// A claim whose status already reports the new size (a ReadWriteMany
// volume another node grew) is not written on success: steps 2 and 4 are
// skipped, and a driver that cannot expand on the node has nothing to do
// here (the kubelet's fix of kubernetes#131381: no NodeResizeError).
//
// It returns no error when the expansion is over (done, or refused for
// good), with the size the volume was grown to or the expansion to hold;
// an error when it is to be retried.
func (vm *VolumeManager) nodeExpand(ctx context.Context, a oe.Action, in reconciler.Input, pods []podvol.PodVolume) (oe.ExpandResult, error) {
	spec, e := in.Spec, in.Expansion
	size := *resource.NewQuantity(e.Size, resource.BinarySI)
	logger := klog.FromContext(ctx).WithValues("pvc", klog.KRef(e.Namespace, e.Claim), "volume", spec.Name, "driver", spec.Driver, "pod", a.Pod.Pod.String(), "size", size.String())
	claims := vm.cfg.KubeClient.CoreV1().PersistentVolumeClaims(e.Namespace)
	pvc, err := claims.Get(ctx, e.Claim, metav1.GetOptions{})
	if err != nil {
		return oe.ExpandResult{}, fmt.Errorf("reading PVC %s/%s before expanding volume %q: %w", e.Namespace, e.Claim, e.PV, err)
	}
	held := oe.ExpandResult{Held: e.Size, HeldClaim: e.ClaimRV}
	due, claimDone := planner.NodeExpansionDue(pvc, size, e.From)
	if target := planner.ExpansionTarget(pvc, size); pvc.Spec.VolumeName != e.PV || !due || target.Cmp(size) != 0 {
		logger.V(2).Info("Node expansion no longer due on this node at this size", "target", target.String())
		return held, nil
	}
	if pvc.Status.AllocatedResourceStatuses[v1.ResourceStorage] == v1.PersistentVolumeClaimNodeResizePending {
		pvc, err = vm.patchClaimStatus(ctx, claims, pvc, true, func(st *v1.PersistentVolumeClaimStatus) {
			st.AllocatedResourceStatuses[v1.ResourceStorage] = v1.PersistentVolumeClaimNodeResizeInProgress
		})
		if err != nil {
			return oe.ExpandResult{}, fmt.Errorf("marking the node expansion of PVC %s/%s in progress: %w", e.Namespace, e.Claim, err)
		}
	}
	expanded, err := nodeExpandVolume(ctx, vm.volumes, volume.ExpandRequest{
		Spec: &spec, Pod: a.Pod.Pod.UID, VolumePath: in.VolumePath, StagingPath: in.DeviceMountPath, Size: e.Size,
	})
	if err != nil {
		class, err := vm.expandFailed(ctx, logger, claims, pvc, e, oe.Outcome{Action: a, Spec: spec}, pods, err)
		if err != nil {
			return oe.ExpandResult{}, err
		}
		if class == expandInUse {
			held.HeldClaim = "" // this node does not try again at that size
		}
		return held, nil
	}
	if claimDone {
		// The claim already says so: this node only grew its own view.
		logger.V(2).Info("Volume expanded on the node; the claim already reported the size", "expanded", expanded)
		if expanded {
			vm.expandedEvents(pods, pvc, e.PV)
		}
		return oe.ExpandResult{Size: e.Size}, nil
	}
	if err := vm.markExpanded(ctx, claims, pvc, e.PV, size); err != nil {
		return oe.ExpandResult{}, fmt.Errorf("volume expanded on the node, but updating PVC %s/%s failed: %w", e.Namespace, e.Claim, err)
	}
	logger.V(2).Info("Volume expanded on the node", "expanded", expanded)
	vm.expandedEvents(pods, pvc, e.PV)
	return oe.ExpandResult{Size: e.Size}, nil
}

// expandFailed records a failed NodeExpandVolume on the claim as the
// kubelet does (classifyExpandError): nothing for an error that
// may be transient; NodeResizeError for a final one, which is retried;
// NodeResizeInfeasible (and NodeResizeError) for a refused request, which
// is not retried until the claim changes. A refusal, or FailedPrecondition
// (the driver cannot expand the volume in use), ends the expansion here:
// the volume stays published and usable, and the pods get an event with
// the cause (refusedEvents). op is the expansion's operation (its Action
// and Spec): an online expansion, or the publish it follows. It returns
// err's class, and err when the expansion is to be retried.
func (vm *VolumeManager) expandFailed(ctx context.Context, logger klog.Logger, claims typedcorev1.PersistentVolumeClaimInterface,
	pvc *v1.PersistentVolumeClaim, e planner.Expansion, op oe.Outcome, pods []podvol.PodVolume, err error) (expandFailure, error) {
	class := classifyExpandError(err)
	if class == expandTransient {
		return class, err
	}
	byClaim := class == expandFailed && finalFailureInfeasible(pvc, e.Size)
	if byClaim {
		class = expandInfeasible
	}
	_, perr := vm.patchClaimStatus(ctx, claims, pvc, false, func(st *v1.PersistentVolumeClaimStatus) {
		if class == expandInfeasible {
			st.AllocatedResourceStatuses[v1.ResourceStorage] = v1.PersistentVolumeClaimNodeResizeInfeasible
		}
		setCondition(st, v1.PersistentVolumeClaimCondition{
			Type: v1.PersistentVolumeClaimNodeResizeError, Status: v1.ConditionTrue,
			LastTransitionTime: metav1.Now(), Message: fmt.Sprintf("failed to expand pvc with %v", err),
		})
	})
	if perr != nil {
		return class, fmt.Errorf("%w (and recording the failure on PVC %s/%s failed: %v)", err, e.Namespace, e.Claim, perr)
	}
	if class == expandFailed {
		return class, err
	}
	why := "refused the expansion; not retried until the claim changes"
	if byClaim {
		why = "failed again after the claim asked for another size; recorded infeasible for the resizer to recover, not retried until the claim changes"
	}
	if class == expandInUse {
		why = "cannot expand the volume while it is in use; not retried on this node at this size"
	}
	logger.Error(err, "Node expansion refused by the driver; the volume stays published at its old size", "why", why)
	vm.refusedEvents(op, class, pods, err)
	return class, nil
}

// finalFailureInfeasible reports whether a final failure (not a refusal)
// of the node expansion of pvc's volume to size is to be recorded as
// infeasible, as the kubelet decides it: the claim asks for another size
// than the one being expanded to (the user recovers from a failed
// expansion by asking for less) and an earlier try already failed for good
// (the claim has the NodeResizeError condition). NodeResizeInfeasible lets
// the resizer lower the allocated size (RecoverVolumeExpansionFailure);
// NodeResizeError would have the node retry the old size for ever.
func finalFailureInfeasible(pvc *v1.PersistentVolumeClaim, size int64) bool {
	req, ok := pvc.Spec.Resources.Requests[v1.ResourceStorage]
	if !ok || req.Value() == size {
		return false
	}
	return slices.ContainsFunc(pvc.Status.Conditions, func(c v1.PersistentVolumeClaimCondition) bool {
		return c.Type == v1.PersistentVolumeClaimNodeResizeError && c.Status == v1.ConditionTrue
	})
}

// refusedEvents records on each pod the event of a node expansion the
// driver refused (class expandInfeasible or expandInUse), for good at this
// size, in the kubelet's words. An infeasible expansion is an error to the
// kubelet, which records it as it records a failed expansion: a
// VolumeResizeFailed event for an online one, the publish's event for one
// while mounting (failureEvent). FailedPrecondition, "cannot expand the
// volume in use", the kubelet only logs; nodevol records
// FileSystemResizeFailed with the kubelet's words for an expansion it
// refuses (those of a read-only volume's), so that the pod shows why its
// volume keeps its size.
func (vm *VolumeManager) refusedEvents(op oe.Outcome, class expandFailure, pods []podvol.PodVolume, err error) {
	for _, p := range pods {
		var reason, msg string
		switch {
		case class == expandInUse:
			_, cause := volume.EventCause(err)
			reason, msg = reconciler.ReasonFSResizeFailed, fmt.Sprintf("MountVolume.NodeExpandVolume failed for volume %q : %s", reconciler.EventVolumeName(op, p), cause)
		case op.Action.Kind == oe.OpExpand:
			op.Err = err
			reason, msg = reconciler.FailureEvent(op, p)
		default:
			op.Err = &reconciler.ExpandError{Err: err}
			reason, msg = reconciler.FailureEvent(op, p)
		}
		vm.podEvents([]podvol.PodVolume{p}, v1.EventTypeWarning, reason, msg)
	}
}

// expandedEvents records a node expansion that succeeded as the kubelet
// does, on the pods and on the claim: FileSystemResizeSuccessful,
// "MountVolume.NodeExpandVolume succeeded for volume "<pv>" <node>".
func (vm *VolumeManager) expandedEvents(pods []podvol.PodVolume, pvc *v1.PersistentVolumeClaim, pv string) {
	if vm.cfg.EventRecorder == nil {
		return
	}
	msg := fmt.Sprintf("MountVolume.NodeExpandVolume succeeded for volume %q %s", pv, vm.cfg.NodeName)
	vm.podEvents(pods, v1.EventTypeNormal, reconciler.ReasonFSResizeSucceeded, msg)
	ref := &v1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: pvc.Namespace, Name: pvc.Name, UID: pvc.UID}
	vm.cfg.EventRecorder.Event(ref, v1.EventTypeNormal, reconciler.ReasonFSResizeSucceeded, msg)
}

// markExpanded records a finished node expansion on the claim, as the
// kubelet does: status capacity set to the new size, the storage resize
// status removed, the resize conditions (FileSystemResizePending,
// Resizing, ControllerResizeError, NodeResizeError) removed. A conflict
// reads the claim again.
func (vm *VolumeManager) markExpanded(ctx context.Context, claims typedcorev1.PersistentVolumeClaimInterface, pvc *v1.PersistentVolumeClaim, pvName string, size resource.Quantity) error {
	first := true
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if !first {
			var err error
			if pvc, err = claims.Get(ctx, pvc.Name, metav1.GetOptions{}); err != nil {
				return err
			}
		}
		first = false
		if pvc.Spec.VolumeName != pvName {
			return nil // bound elsewhere meanwhile: not ours to update
		}
		_, err := vm.patchClaimStatus(ctx, claims, pvc, true, func(st *v1.PersistentVolumeClaimStatus) {
			if st.Capacity == nil {
				st.Capacity = v1.ResourceList{}
			}
			st.Capacity[v1.ResourceStorage] = size
			delete(st.AllocatedResourceStatuses, v1.ResourceStorage)
			if len(st.AllocatedResourceStatuses) == 0 {
				st.AllocatedResourceStatuses = nil
			}
			conds := []v1.PersistentVolumeClaimCondition{}
			for _, c := range st.Conditions {
				if !resizeConditions[c.Type] {
					conds = append(conds, c)
				}
			}
			st.Conditions = conds
		})
		return err
	})
}

// resizeConditions are the claim conditions of a resize, which a finished
// node expansion removes.
var resizeConditions = map[v1.PersistentVolumeClaimConditionType]bool{
	v1.PersistentVolumeClaimFileSystemResizePending: true,
	v1.PersistentVolumeClaimResizing:                true,
	v1.PersistentVolumeClaimControllerResizeError:   true,
	v1.PersistentVolumeClaimNodeResizeError:         true,
}

// setCondition sets c in st, replacing a condition of its type.
func setCondition(st *v1.PersistentVolumeClaimStatus, c v1.PersistentVolumeClaimCondition) {
	for i := range st.Conditions {
		if st.Conditions[i].Type == c.Type {
			st.Conditions[i] = c
			return
		}
	}
	st.Conditions = append(st.Conditions, c)
}

// patchClaimStatus writes change to the claim's status with a strategic
// merge patch on the status subresource, as the kubelet does (a PATCH
// never drops fields this client does not know). With checkRV the patch
// carries the claim's resourceVersion, so that it fails with a conflict
// when the claim changed since it was read. The patch is a step
// (Config.Steps).
func (vm *VolumeManager) patchClaimStatus(ctx context.Context, claims typedcorev1.PersistentVolumeClaimInterface, old *v1.PersistentVolumeClaim,
	checkRV bool, change func(*v1.PersistentVolumeClaimStatus)) (*v1.PersistentVolumeClaim, error) {
	updated := old.DeepCopy()
	if updated.Status.AllocatedResourceStatuses == nil {
		updated.Status.AllocatedResourceStatuses = map[v1.ResourceName]v1.ClaimResourceStatus{}
	}
	change(&updated.Status)
	if len(updated.Status.AllocatedResourceStatuses) == 0 {
		updated.Status.AllocatedResourceStatuses = nil // no entry, no field
	}
	patch, err := claimStatusPatch(old, updated, checkRV)
	if err != nil {
		return nil, fmt.Errorf("building the status patch of PVC %s/%s: %w", old.Namespace, old.Name, err)
	}
	if err := vm.cfg.Steps.Take(step.Call, "patch the status of PVC "+old.Namespace+"/"+old.Name); err != nil {
		return nil, fmt.Errorf("patching the status of PVC %s/%s: %w", old.Namespace, old.Name, err)
	}
	return claims.Patch(ctx, old.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
}

// claimStatusPatch returns the strategic merge patch from old to updated,
// with old's resourceVersion when checkRV.
func claimStatusPatch(old, updated *v1.PersistentVolumeClaim, checkRV bool) ([]byte, error) {
	oldData, err := json.Marshal(old)
	if err != nil {
		return nil, err
	}
	newData, err := json.Marshal(updated)
	if err != nil {
		return nil, err
	}
	patch, err := strategicpatch.CreateTwoWayMergePatch(oldData, newData, v1.PersistentVolumeClaim{})
	if err != nil {
		return nil, err
	}
	if !checkRV {
		return patch, nil
	}
	var m map[string]any
	if err := json.Unmarshal(patch, &m); err != nil {
		return nil, err
	}
	meta, _ := m["metadata"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
		m["metadata"] = meta
	}
	meta["resourceVersion"] = old.ResourceVersion
	return json.Marshal(m)
}

// podEvents records an event on each pod.
func (vm *VolumeManager) podEvents(pods []podvol.PodVolume, kind, reason, msg string) {
	if vm.cfg.EventRecorder == nil {
		return
	}
	for _, p := range pods {
		ref := reconciler.PodObjectRef(p.Pod)
		vm.cfg.EventRecorder.Event(ref, kind, reason, msg)
	}
}

// nodeExpandVolume asks the plugin of req's volume, found in volumes, to
// grow it on the node (volume.Expander): whichever kind the volume is, the
// manager knows it only through the contract. A plugin that is no Expander has nothing to
// do on the node (expanded false), as a CSI driver without node
// expansion; a volume whose plugin is gone (a flexVolume driver removed)
// is not ready, and the expansion is tried again.
func nodeExpandVolume(ctx context.Context, volumes *volume.Registry, req volume.ExpandRequest) (expanded bool, err error) {
	p, err := volumes.ForVolume(req.Spec.Name)
	if err != nil {
		return false, fmt.Errorf("%w: %w", volume.ErrNotReady, err)
	}
	if ex, ok := p.(volume.Expander); ok {
		return ex.NodeExpand(ctx, req)
	}
	return false, nil
}

// expandsVolumes reports whether one of plugins grows volumes on the node
// (volume.Expander): only then does the manager look for the node
// expansions its claims ask for.
func expandsVolumes(plugins []volume.Plugin) bool {
	return slices.ContainsFunc(plugins, isExpander)
}

// isExpander reports whether p grows its volumes on the node.
func isExpander(p volume.Plugin) bool {
	_, ok := p.(volume.Expander)
	return ok
}

// expandFailure is what a failed node expansion means for the claim, as
// the kubelet's node expander decides it, read from the contract's class
// of the plugin's error (classifyExpandError).
type expandFailure int

const (
	// expandTransient: the call may still be running, or did not reach
	// the plugin (a driver not registered, a call timed out): the claim is
	// not touched and the expansion is retried.
	expandTransient expandFailure = iota
	// expandFailed: the plugin failed for good this time (CSI Internal,
	// ...): the claim gets the NodeResizeError condition and the
	// expansion is retried with backoff.
	expandFailed
	// expandInfeasible: the plugin refuses the request
	// (volume.ErrInfeasible): the claim's storage resize status becomes
	// NodeResizeInfeasible, and nothing retries until the claim changes.
	expandInfeasible
	// expandInUse: the plugin cannot expand the volume while it is in use
	// (volume.ErrNotWhileInUse): the claim gets NodeResizeError; the mount
	// goes on, and this node does not try again at that size.
	expandInUse
)

// classifyExpandError says what err, returned by a plugin's NodeExpand,
// means for the claim.
func classifyExpandError(err error) expandFailure {
	switch {
	case errors.Is(err, volume.ErrInProgress), errors.Is(err, volume.ErrNotReady):
		return expandTransient
	case errors.Is(err, volume.ErrInfeasible):
		return expandInfeasible
	case errors.Is(err, volume.ErrNotWhileInUse):
		return expandInUse
	}
	return expandFailed
}
