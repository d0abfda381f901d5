package volumemanager

import (
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// trimPod returns a copy of pod holding only what the volume manager reads
// from it: the loop keeps every pod it was given until the pod is deleted
// (to resolve it again when a claim or volume changes), and a pod's images,
// commands, environment, probes, resources and status are most of its bytes
// and none of nodevol's business.
//
// Kept: name, namespace, UID; the service account name; the pod's security
// context (fsGroup, its change policy, SELinux options and change policy;
// supplemental groups are read from the caller's pod, not from this copy);
// the volumes podCSIVolumes selects (the CSI, PVC, generic ephemeral and
// migrated in-tree volumes a container mounts or maps); and of each
// container (init, regular, ephemeral) that mounts or maps one of those
// volumes, the names of those mounts and devices and its seLinuxOptions.
// Every function that reads a pod in this package gives the same answer
// for the copy as for the pod (TestTrimPod).
func trimPod(pod *v1.Pod) *v1.Pod {
	vols, _ := podCSIVolumes(pod)
	out := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID},
		Spec:       v1.PodSpec{ServiceAccountName: pod.Spec.ServiceAccountName},
	}
	if sc := pod.Spec.SecurityContext; sc != nil {
		out.Spec.SecurityContext = &v1.PodSecurityContext{
			FSGroup:             sc.FSGroup,
			FSGroupChangePolicy: sc.FSGroupChangePolicy,
			SELinuxOptions:      sc.SELinuxOptions,
			SELinuxChangePolicy: sc.SELinuxChangePolicy,
		}
		out.Spec.SecurityContext = out.Spec.SecurityContext.DeepCopy() // no pointer into the caller's pod
	}
	if len(vols) == 0 {
		return out
	}
	keep := make(map[string]bool, len(vols))
	out.Spec.Volumes = make([]v1.Volume, len(vols))
	for i := range vols {
		keep[vols[i].Name] = true
		vols[i].DeepCopyInto(&out.Spec.Volumes[i])
	}
	mounts := func(ms []v1.VolumeMount) []v1.VolumeMount {
		var out []v1.VolumeMount
		for _, m := range ms {
			if keep[m.Name] {
				out = append(out, v1.VolumeMount{Name: m.Name})
			}
		}
		return out
	}
	devices := func(ds []v1.VolumeDevice) []v1.VolumeDevice {
		var out []v1.VolumeDevice
		for _, d := range ds {
			if keep[d.Name] {
				out = append(out, v1.VolumeDevice{Name: d.Name})
			}
		}
		return out
	}
	seLinux := func(sc *v1.SecurityContext) *v1.SecurityContext {
		if sc == nil || sc.SELinuxOptions == nil {
			return nil
		}
		return &v1.SecurityContext{SELinuxOptions: sc.SELinuxOptions.DeepCopy()}
	}
	containers := func(cs []v1.Container) []v1.Container {
		var out []v1.Container
		for i := range cs {
			c := v1.Container{Name: cs[i].Name, VolumeMounts: mounts(cs[i].VolumeMounts), VolumeDevices: devices(cs[i].VolumeDevices)}
			if c.VolumeMounts == nil && c.VolumeDevices == nil {
				continue
			}
			c.SecurityContext = seLinux(cs[i].SecurityContext)
			out = append(out, c)
		}
		return out
	}
	out.Spec.InitContainers = containers(pod.Spec.InitContainers)
	out.Spec.Containers = containers(pod.Spec.Containers)
	for i := range pod.Spec.EphemeralContainers {
		ec := &pod.Spec.EphemeralContainers[i]
		// Ephemeral containers cannot have volumeDevices; their mounts count.
		if ms := mounts(ec.VolumeMounts); ms != nil {
			out.Spec.EphemeralContainers = append(out.Spec.EphemeralContainers, v1.EphemeralContainer{
				EphemeralContainerCommon: v1.EphemeralContainerCommon{Name: ec.Name, VolumeMounts: ms, SecurityContext: seLinux(ec.SecurityContext)},
			})
		}
	}
	return out
}

// keptPod is what the inbox keeps of a pod between AddPod and DeletePod:
// trimPod's copy without v1.Pod's and v1.Container's fixed sizes (1,240 and
// 408 bytes, mostly fields the copy leaves empty). pod gives trimPod's copy
// back when the loop resolves the pod.
type keptPod struct {
	uid                             types.UID
	namespace, name, serviceAccount string
	securityContext                 *v1.PodSecurityContext
	volumes                         []v1.Volume
	containers                      []keptContainer
}

// keptContainer is a container of trimPod's copy.
type keptContainer struct {
	kind            containerKind
	name            string
	mounts, devices []string
	seLinux         *v1.SELinuxOptions
}

type containerKind uint8

const (
	initContainer containerKind = iota
	regularContainer
	ephemeralContainer
)

// keepPod returns what the inbox keeps of pod.
func keepPod(pod *v1.Pod) *keptPod {
	t := trimPod(pod)
	k := &keptPod{uid: t.UID, namespace: t.Namespace, name: t.Name, serviceAccount: t.Spec.ServiceAccountName,
		securityContext: t.Spec.SecurityContext, volumes: t.Spec.Volumes}
	add := func(kind containerKind, name string, ms []v1.VolumeMount, ds []v1.VolumeDevice, sc *v1.SecurityContext) {
		c := keptContainer{kind: kind, name: name}
		for _, m := range ms {
			c.mounts = append(c.mounts, m.Name)
		}
		for _, d := range ds {
			c.devices = append(c.devices, d.Name)
		}
		if sc != nil {
			c.seLinux = sc.SELinuxOptions
		}
		k.containers = append(k.containers, c)
	}
	for _, c := range t.Spec.InitContainers {
		add(initContainer, c.Name, c.VolumeMounts, c.VolumeDevices, c.SecurityContext)
	}
	for _, c := range t.Spec.Containers {
		add(regularContainer, c.Name, c.VolumeMounts, c.VolumeDevices, c.SecurityContext)
	}
	for _, c := range t.Spec.EphemeralContainers {
		add(ephemeralContainer, c.Name, c.VolumeMounts, nil, c.SecurityContext)
	}
	return k
}

// pod returns trimPod's copy of the pod; nil for nil (a deleted pod). The
// copy shares memory with k: its readers do not write.
func (k *keptPod) pod() *v1.Pod {
	if k == nil {
		return nil
	}
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: k.name, Namespace: k.namespace, UID: k.uid},
		Spec:       v1.PodSpec{ServiceAccountName: k.serviceAccount, SecurityContext: k.securityContext, Volumes: k.volumes},
	}
	for _, c := range k.containers {
		var ms []v1.VolumeMount
		for _, m := range c.mounts {
			ms = append(ms, v1.VolumeMount{Name: m})
		}
		var ds []v1.VolumeDevice
		for _, d := range c.devices {
			ds = append(ds, v1.VolumeDevice{Name: d})
		}
		var sc *v1.SecurityContext
		if c.seLinux != nil {
			sc = &v1.SecurityContext{SELinuxOptions: c.seLinux}
		}
		switch c.kind {
		case initContainer:
			p.Spec.InitContainers = append(p.Spec.InitContainers, v1.Container{Name: c.name, VolumeMounts: ms, VolumeDevices: ds, SecurityContext: sc})
		case regularContainer:
			p.Spec.Containers = append(p.Spec.Containers, v1.Container{Name: c.name, VolumeMounts: ms, VolumeDevices: ds, SecurityContext: sc})
		case ephemeralContainer:
			p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, v1.EphemeralContainer{
				EphemeralContainerCommon: v1.EphemeralContainerCommon{Name: c.name, VolumeMounts: ms, SecurityContext: sc}})
		}
	}
	return p
}
