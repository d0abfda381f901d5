package volumemanager

import (
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/volume"
)

// keptPod is what the inbox keeps of a pod between AddPod and DeletePod,
// only what the volume manager reads from it: the loop keeps every pod it
// was given until the pod is deleted (to resolve it again when a claim or
// volume changes), and a pod's images, commands, environment, probes,
// resources and status are most of its bytes and none of nodevol's
// business. It does not hold a v1.Pod either: v1.Pod and v1.Container are
// 1,240 and 408 bytes, mostly fields left empty here. pod gives a v1.Pod
// back when the loop resolves the pod.
//
// Kept: name, namespace, UID; the service account name; the pod's security
// context (fsGroup, its change policy, SELinux options and change policy;
// supplemental groups are read from the caller's pod, not from this copy);
// the volumes podVolumes selects (those a container mounts or maps and a
// registered plugin handles, or that fail to resolve); and of each
// container (init, regular, ephemeral) that mounts or maps one of those
// volumes, the names of those mounts and devices and its seLinuxOptions.
// Every function that reads a pod in this package gives the same answer
// for keepPod(pod).pod() as for the pod (TestTrimPod).
type keptPod struct {
	uid                             types.UID
	namespace, name, serviceAccount string
	securityContext                 *v1.PodSecurityContext
	volumes                         []v1.Volume
	containers                      []keptContainer
}

// keptContainer is what keptPod keeps of a container.
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

// keepPod returns what the inbox keeps of pod, sharing no memory with it,
// and the names of its volumes left out because their kind's plugin is
// still to come (podVolumes).
func keepPod(pod *v1.Pod, plugins *volume.Registry) (*keptPod, []string) {
	k := &keptPod{uid: pod.UID, namespace: pod.Namespace, name: pod.Name, serviceAccount: pod.Spec.ServiceAccountName}
	if sc := pod.Spec.SecurityContext; sc != nil {
		k.securityContext = (&v1.PodSecurityContext{
			FSGroup:             sc.FSGroup,
			FSGroupChangePolicy: sc.FSGroupChangePolicy,
			SELinuxOptions:      sc.SELinuxOptions,
			SELinuxChangePolicy: sc.SELinuxChangePolicy,
		}).DeepCopy() // no pointer into the caller's pod
	}
	vols, coming := podVolumes(pod, plugins)
	if len(vols) == 0 {
		return k, coming
	}
	keep := make(map[string]bool, len(vols))
	k.volumes = make([]v1.Volume, len(vols))
	for i := range vols {
		keep[vols[i].Name] = true
		vols[i].DeepCopyInto(&k.volumes[i])
	}
	add := func(kind containerKind, name string, ms []v1.VolumeMount, ds []v1.VolumeDevice, sc *v1.SecurityContext) {
		c := keptContainer{kind: kind, name: name}
		for _, m := range ms {
			if keep[m.Name] {
				c.mounts = append(c.mounts, m.Name)
			}
		}
		for _, d := range ds {
			if keep[d.Name] {
				c.devices = append(c.devices, d.Name)
			}
		}
		if c.mounts == nil && c.devices == nil {
			return // the container uses none of nodevol's volumes
		}
		if sc != nil && sc.SELinuxOptions != nil {
			c.seLinux = sc.SELinuxOptions.DeepCopy()
		}
		k.containers = append(k.containers, c)
	}
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		add(initContainer, c.Name, c.VolumeMounts, c.VolumeDevices, c.SecurityContext)
	}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		add(regularContainer, c.Name, c.VolumeMounts, c.VolumeDevices, c.SecurityContext)
	}
	for i := range pod.Spec.EphemeralContainers {
		c := &pod.Spec.EphemeralContainers[i]
		// Ephemeral containers cannot have volumeDevices; their mounts count.
		add(ephemeralContainer, c.Name, c.VolumeMounts, nil, c.SecurityContext)
	}
	return k, coming
}

// pod returns the kept pod as a v1.Pod; nil for nil (a deleted pod). It
// shares memory with k: its readers do not write.
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
