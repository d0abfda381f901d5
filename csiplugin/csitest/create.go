package csitest

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// CreateBound creates pvc and pv through client (any kubernetes.Interface:
// a fake clientset or a real API server's) and binds them as the PV
// controller leaves them, then returns both as stored: the way to get a
// bound claim (built with BoundClaim) that works the same with a fake
// clientset and a real API server.
//
// A real API server gives the claim a UID of its own and ignores the
// status sent with a create, so a pair built in advance (as BoundClaim
// builds it) cannot be created as it is: the volume's claimRef would name
// a UID the claim does not have, and the kubelet and nodevol refuse such a
// binding. CreateBound therefore creates the claim with spec.volumeName
// pv.Name, creates the volume with a claimRef naming the UID the claim was
// given, and then sets the claim's status (phase Bound; the volume's
// capacity and access modes where pvc has none) and the volume's (phase
// Bound) through the status subresource. pvc and pv are not changed; the
// UIDs, resource versions and claimRef they carry are replaced (a fake
// clientset keeps the UIDs the builders set, so its results equal
// BoundClaim's).
//
// An error names the object and the step that failed; objects created
// before it are left in place.
func CreateBound(ctx context.Context, client kubernetes.Interface, pvc *v1.PersistentVolumeClaim, pv *v1.PersistentVolume) (*v1.PersistentVolumeClaim, *v1.PersistentVolume, error) {
	pvc, pv = pvc.DeepCopy(), pv.DeepCopy()
	claims := client.CoreV1().PersistentVolumeClaims(pvc.Namespace)
	status := boundClaimStatus(pvc, pv)

	pvc.ResourceVersion = ""
	if pvc.UID == "" { // a fake clientset keeps what it is given
		pvc.UID = uidFor("PersistentVolumeClaim", pvc.Namespace, pvc.Name)
	}
	pvc.Spec.VolumeName = pv.Name
	claim, err := claims.Create(ctx, pvc, metav1.CreateOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("csitest: create PersistentVolumeClaim %s/%s: %w", pvc.Namespace, pvc.Name, err)
	}

	pv.ResourceVersion = ""
	if pv.UID == "" {
		pv.UID = uidFor("PersistentVolume", "", pv.Name)
	}
	pv.Spec.ClaimRef = &v1.ObjectReference{
		Kind: "PersistentVolumeClaim", APIVersion: "v1",
		Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID,
	}
	vol, err := client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("csitest: create PersistentVolume %s of claim %s/%s: %w", pv.Name, claim.Namespace, claim.Name, err)
	}

	claim.Status = status
	if claim, err = claims.UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		return nil, nil, fmt.Errorf("csitest: set the status of PersistentVolumeClaim %s/%s to Bound: %w", pvc.Namespace, pvc.Name, err)
	}
	vol.Status.Phase = v1.VolumeBound
	if vol, err = client.CoreV1().PersistentVolumes().UpdateStatus(ctx, vol, metav1.UpdateOptions{}); err != nil {
		return nil, nil, fmt.Errorf("csitest: set the status of PersistentVolume %s to Bound: %w", pv.Name, err)
	}
	return claim, vol, nil
}

// boundClaimStatus is pvc's status as the PV controller leaves it once it
// has bound pvc to pv: phase Bound, with pv's capacity and access modes
// unless pvc's status already has its own.
func boundClaimStatus(pvc *v1.PersistentVolumeClaim, pv *v1.PersistentVolume) v1.PersistentVolumeClaimStatus {
	status := *pvc.Status.DeepCopy()
	status.Phase = v1.ClaimBound
	if len(status.Capacity) == 0 {
		status.Capacity = pv.Spec.Capacity.DeepCopy()
	}
	if len(status.AccessModes) == 0 {
		status.AccessModes = append([]v1.PersistentVolumeAccessMode(nil), pv.Spec.AccessModes...)
	}
	return status
}
