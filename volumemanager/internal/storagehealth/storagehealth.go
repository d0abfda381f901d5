// Package storagehealth writes a CSI driver's storage health into the
// status of the node's CSINode object, as the kubelet does for
// CSIVolumeHealth: once per change of the conditions' identities.
package storagehealth

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// Update sets driver's entry in the status.storageHealth of
// the CSINode named nodeName to conds (no entry when conds is empty: the
// storage is healthy), leaving the other drivers' entries alone, and
// reports whether it wrote. As in the kubelet it writes (through the
// status subresource, retried on conflict) only when the set of the
// conditions' identities (status, reason, access mode, volume mode)
// changed: a new message alone is not written. A condition whose identity
// was there before keeps its lastTransitionTime; a new one gets now. A
// missing CSINode is an error: it is made when the first driver
// registers, before its storage health is asked.
//
// With a node's own credentials this needs the CSIVolumeHealth feature on
// the API server (1.37: alpha, off by default): the Node authorizer and
// the system:node role allow get, update and patch of csinodes/status to
// the node whose name it has only then, and NodeRestriction refuses the
// status subresource without it; the API server also drops the field
// while the feature is off.
func Update(ctx context.Context, client kubernetes.Interface, nodeName, driver string,
	conds []storagev1.StorageHealthCondition, now metav1.Time) (bool, error) {
	csiNodes := client.StorageV1().CSINodes()
	wrote := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		wrote = false
		cn, err := csiNodes.Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		i := slices.IndexFunc(cn.Status.StorageHealth, func(h storagev1.StorageHealth) bool { return h.Name == driver })
		var old []storagev1.StorageHealthCondition
		if i >= 0 {
			old = cn.Status.StorageHealth[i].HealthConditions
		}
		if Same(old, conds) {
			return nil
		}
		updated := cn.DeepCopy()
		health := slices.DeleteFunc(updated.Status.StorageHealth, func(h storagev1.StorageHealth) bool { return h.Name == driver })
		if len(conds) > 0 {
			health = append(health, storagev1.StorageHealth{Name: driver, HealthConditions: withTransitionTimes(old, conds, now)})
		}
		updated.Status.StorageHealth = health
		if _, err := csiNodes.UpdateStatus(ctx, updated, metav1.UpdateOptions{}); err != nil {
			return err
		}
		wrote = true
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("updating the storage health of CSI driver %s in CSINode %s: %w", driver, nodeName, err)
	}
	return wrote, nil
}

// storageHealthIdentity is what makes two storage health conditions the
// same one: the message and the time are not part of it.
type storageHealthIdentity struct {
	status             storagev1.StorageHealthStatusType
	reason             string
	accessMode, volume string
}

func identityOf(c storagev1.StorageHealthCondition) storageHealthIdentity {
	id := storageHealthIdentity{status: c.Status, reason: c.Reason}
	if c.AccessMode != nil {
		id.accessMode = string(*c.AccessMode)
	}
	if c.VolumeMode != nil {
		id.volume = string(*c.VolumeMode)
	}
	return id
}

// Same reports whether a and b hold the same set of
// identities (status, reason, access mode, volume mode; duplicates and
// order aside): whether Update would write b over a.
func Same(a, b []storagev1.StorageHealthCondition) bool {
	set := func(cs []storagev1.StorageHealthCondition) map[storageHealthIdentity]bool {
		m := make(map[storageHealthIdentity]bool, len(cs))
		for _, c := range cs {
			m[identityOf(c)] = true
		}
		return m
	}
	sa, sb := set(a), set(b)
	if len(sa) != len(sb) {
		return false
	}
	for id := range sa {
		if !sb[id] {
			return false
		}
	}
	return true
}

// withTransitionTimes returns conds with the lastTransitionTime of the
// condition of the same identity in old, or now for a new one.
func withTransitionTimes(old, conds []storagev1.StorageHealthCondition, now metav1.Time) []storagev1.StorageHealthCondition {
	since := map[storageHealthIdentity]metav1.Time{}
	for _, c := range old {
		if !c.LastTransitionTime.IsZero() {
			since[identityOf(c)] = c.LastTransitionTime
		}
	}
	out := make([]storagev1.StorageHealthCondition, len(conds))
	for i, c := range conds {
		c.AccessMode, c.VolumeMode = clonePtr(c.AccessMode), clonePtr(c.VolumeMode)
		c.LastTransitionTime = now
		if t, ok := since[identityOf(c)]; ok {
			c.LastTransitionTime = t
		}
		out[i] = c
	}
	return out
}

func clonePtr[T corev1.PersistentVolumeAccessMode | corev1.PersistentVolumeMode](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}
