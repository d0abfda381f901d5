package emptydir

import (
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// podMemoryLimit is the memory limit the kubelet gives pod's cgroup, in
// bytes, 0 for none, as its ResourceConfigForPod decides it (with the
// default feature gates of v1.37: PodLevelResources and its QoS fix on):
// a Guaranteed pod's limit, a Burstable pod's only when every init and
// regular container declares a memory limit or the pod declares one at
// pod level, none for a BestEffort pod. The limit itself is podLimits'.
func podMemoryLimit(pod *v1.Pod) int64 {
	declared := true
	for _, cs := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			if cs[i].Resources.Limits.Memory().IsZero() {
				declared = false
			}
		}
	}
	if podLevelSet(pod) && !pod.Spec.Resources.Limits.Memory().IsZero() {
		declared = true
	}
	switch podQOS(pod) {
	case v1.PodQOSGuaranteed:
	case v1.PodQOSBurstable:
		if !declared {
			return 0
		}
	default:
		return 0
	}
	limit := podLimits(pod)
	return limit.Value()
}

// podLimits is the pod's memory limit as the kubelet's resource helper
// (component-helpers PodLimits) sums it: the regular containers' limits
// and the restartable init containers' (sidecars), or, when larger, the
// largest need of an init container (its limit plus those of the sidecars
// started before it); replaced by the pod-level limit when the pod has
// pod-level resources with one; plus the pod's overhead when not zero.
func podLimits(pod *v1.Pod) resource.Quantity {
	var sum, sidecars, initMax resource.Quantity
	for i := range pod.Spec.Containers {
		sum.Add(memLimit(&pod.Spec.Containers[i]))
	}
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		need := memLimit(c)
		if c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways {
			sum.Add(need)
			sidecars.Add(need)
			need = sidecars.DeepCopy()
		} else {
			need.Add(sidecars)
		}
		if need.Cmp(initMax) > 0 {
			initMax = need
		}
	}
	if initMax.Cmp(sum) > 0 {
		sum = initMax
	}
	if podLevelSet(pod) {
		if q, ok := pod.Spec.Resources.Limits[v1.ResourceMemory]; ok {
			sum = q.DeepCopy()
		}
	}
	if q, ok := pod.Spec.Overhead[v1.ResourceMemory]; ok && !sum.IsZero() {
		sum.Add(q)
	}
	return sum
}

func memLimit(c *v1.Container) resource.Quantity {
	return c.Resources.Limits.Memory().DeepCopy()
}

// podLevelSet reports whether pod has pod-level resources the kubelet
// supports (cpu, memory, hugepages) among its requests or limits.
func podLevelSet(pod *v1.Pod) bool {
	r := pod.Spec.Resources
	if r == nil {
		return false
	}
	for _, l := range []v1.ResourceList{r.Requests, r.Limits} {
		for name := range l {
			if name == v1.ResourceCPU || name == v1.ResourceMemory || strings.HasPrefix(string(name), v1.ResourceHugePagesPrefix) {
				return true
			}
		}
	}
	return false
}

// podQOS is the pod's QoS class as the kubelet reads it: its status's, or
// computed from its pod-level resources when set, else from its init and
// regular containers.
func podQOS(pod *v1.Pod) v1.PodQOSClass {
	if pod.Status.QOSClass != "" {
		return pod.Status.QOSClass
	}
	if podLevelSet(pod) {
		return requirementsQOS(pod.Spec.Resources)
	}
	var qos v1.PodQOSClass
	for _, cs := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			switch c := requirementsQOS(&cs[i].Resources); {
			case c == v1.PodQOSBurstable:
				return c
			case qos == "":
				qos = c
			case qos != c:
				return v1.PodQOSBurstable
			}
		}
	}
	if qos == "" {
		return v1.PodQOSBestEffort
	}
	return qos
}

// requirementsQOS is the QoS class of one set of requirements: Guaranteed
// when cpu and memory each have equal, non-zero requests and limits,
// BestEffort when neither has any, Burstable otherwise.
func requirementsQOS(r *v1.ResourceRequirements) v1.PodQOSClass {
	if len(r.Requests) == 0 && len(r.Limits) == 0 {
		return v1.PodQOSBestEffort
	}
	var qos v1.PodQOSClass
	for _, name := range []v1.ResourceName{v1.ResourceCPU, v1.ResourceMemory} {
		req, lim := r.Requests[name], r.Limits[name]
		c := v1.PodQOSGuaranteed
		switch {
		case !req.Equal(lim):
			return v1.PodQOSBurstable
		case req.IsZero():
			c = v1.PodQOSBestEffort
		}
		if qos != "" && qos != c {
			return v1.PodQOSBurstable
		}
		qos = c
	}
	return qos
}

// hugePageSize returns the page size of a hugepages volume of medium m,
// as the kubelet's getPageSizeMountOption finds it among the hugepage
// requests of the pod (pod-level, then regular and init containers): for
// HugePages, the one size they request (several sizes are an error); for
// HugePages-<size>, that size if they request it. No size found is an
// error, with the kubelet's messages.
func hugePageSize(m v1.StorageMedium, pod *v1.Pod) (string, error) {
	var want resource.Quantity
	if m != v1.StorageMediumHugePages {
		q, err := resource.ParseQuantity(strings.TrimPrefix(string(m), string(v1.StorageMediumHugePagesPrefix)))
		if err != nil {
			return "", fmt.Errorf("medium %s: invalid page size: %w", m, err)
		}
		want = q
	}
	var lists []v1.ResourceList
	if podLevelSet(pod) {
		lists = append(lists, pod.Spec.Resources.Requests)
	}
	for _, cs := range [][]v1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for i := range cs {
			lists = append(lists, cs[i].Resources.Requests)
		}
	}
	var size *resource.Quantity
	for _, l := range lists {
		for name := range l {
			if !strings.HasPrefix(string(name), v1.ResourceHugePagesPrefix) {
				continue
			}
			q, err := resource.ParseQuantity(strings.TrimPrefix(string(name), v1.ResourceHugePagesPrefix))
			if err != nil {
				return "", fmt.Errorf("medium %s: resource %s: invalid page size: %w", m, name, err)
			}
			switch {
			case m == v1.StorageMediumHugePages && size != nil && size.Cmp(q) != 0:
				return "", fmt.Errorf("medium: %s can't be used if container requests multiple huge page sizes", m)
			case m == v1.StorageMediumHugePages || q.Cmp(want) == 0:
				size = &q
			}
		}
	}
	if size == nil {
		return "", fmt.Errorf("medium %s: hugePages storage requested, but there is no resource request for huge pages", m)
	}
	return size.String(), nil
}
