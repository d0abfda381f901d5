package downward

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// resourceValue is the value of the resource sel names of the container it
// names, the kubelet's ExtractResourceValueByContainerNameAndNodeAllocatable,
// with its error texts.
func resourceValue(pod *v1.Pod, sel *v1.ResourceFieldSelector, nodeAllocatable v1.ResourceList) (string, error) {
	c := findContainer(pod, sel.ContainerName)
	if c == nil {
		return "", fmt.Errorf("container %s not found", sel.ContainerName)
	}
	limits := withDefaultLimits(c.Resources.Limits, nodeAllocatable)
	requests := c.Resources.Requests
	divisor := sel.Divisor
	if divisor.IsZero() {
		divisor = resource.MustParse("1")
	}
	switch sel.Resource {
	case "limits.cpu":
		return cpuValue(limits.Cpu(), divisor), nil
	case "limits.memory":
		return bytesValue(limits.Memory(), divisor), nil
	case "limits.ephemeral-storage":
		return bytesValue(limits.StorageEphemeral(), divisor), nil
	case "requests.cpu":
		return cpuValue(requests.Cpu(), divisor), nil
	case "requests.memory":
		return bytesValue(requests.Memory(), divisor), nil
	case "requests.ephemeral-storage":
		return bytesValue(requests.StorageEphemeral(), divisor), nil
	}
	for prefix, list := range map[string]v1.ResourceList{"requests.": requests, "limits.": limits} {
		if name, ok := strings.CutPrefix(sel.Resource, prefix); ok && strings.HasPrefix(name, v1.ResourceHugePagesPrefix) {
			return bytesValue(list.Name(v1.ResourceName(name), resource.BinarySI), divisor), nil
		}
	}
	return "", fmt.Errorf("unsupported container resource : %v", sel.Resource)
}

// findContainer returns pod's container name: a regular container, else
// an init container (sidecars included); nil when there is none.
func findContainer(pod *v1.Pod, name string) *v1.Container {
	for _, cs := range [][]v1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for i := range cs {
			if cs[i].Name == name {
				return &cs[i]
			}
		}
	}
	return nil
}

// withDefaultLimits returns a copy of limits in which a limit of cpu,
// memory or ephemeral-storage that is missing or zero is the node's
// allocatable amount, when known (hugepages are never overcommitted: a
// container always declares their limit).
func withDefaultLimits(limits, allocatable v1.ResourceList) v1.ResourceList {
	out := make(v1.ResourceList, len(limits)+3)
	for name, q := range limits {
		out[name] = q.DeepCopy()
	}
	for _, name := range []v1.ResourceName{v1.ResourceCPU, v1.ResourceMemory, v1.ResourceEphemeralStorage} {
		if q, ok := out[name]; ok && !q.IsZero() {
			continue
		}
		if a, ok := allocatable[name]; ok {
			out[name] = a.DeepCopy()
		}
	}
	return out
}

// cpuValue is cpu in units of divisor, rounded up, computed in
// millicores and float64 as the kubelet computes it.
func cpuValue(cpu *resource.Quantity, divisor resource.Quantity) string {
	return strconv.FormatInt(int64(math.Ceil(float64(cpu.MilliValue())/float64(divisor.MilliValue()))), 10)
}

// bytesValue is q (memory, ephemeral storage, hugepages) in units of
// divisor, rounded up, computed in float64 as the kubelet computes it.
func bytesValue(q *resource.Quantity, divisor resource.Quantity) string {
	return strconv.FormatInt(int64(math.Ceil(float64(q.Value())/float64(divisor.Value()))), 10)
}
