package volumemanager

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"

	v1 "k8s.io/api/core/v1"
)

// GetExtraSupplementalGroupsForPod returns the groups the pod's containers
// need beyond the pod's own supplementalGroups to use its volumes: the
// pv.beta.kubernetes.io/gid annotations of its PVs, as the kubelet does.
// Annotations that are not a number are ignored.
func (vm *VolumeManager) GetExtraSupplementalGroupsForPod(pod *v1.Pod) []int64 {
	st, ok := vm.dsw.Pod(pod.UID)
	if !ok {
		return nil
	}
	var have []int64
	if sc := pod.Spec.SecurityContext; sc != nil {
		have = sc.SupplementalGroups
	}
	var out []int64
	for _, name := range st.Volumes {
		spec, _, ok := vm.dsw.Volume(name)
		if !ok || spec.GID == "" {
			continue
		}
		gid, err := strconv.ParseInt(spec.GID, 10, 64)
		if err != nil || slices.Contains(have, gid) || slices.Contains(out, gid) {
			continue
		}
		out = append(out, gid)
	}
	slices.Sort(out)
	return out
}

// WaitForAllPodsUnmount waits, for all pods at once, until none of their
// volumes is mounted or may be (as WaitForUnmount); the error joins each
// pod's. For a node shutting down.
func (vm *VolumeManager) WaitForAllPodsUnmount(ctx context.Context, pods []*v1.Pod) error {
	errs := make([]error, len(pods))
	var wg sync.WaitGroup
	for i, p := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = vm.WaitForUnmount(ctx, p)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
