package resolve

import (
	"maps"
	"strings"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/nodevol/nodevol/internal/atomicwriter"
	"github.com/nodevol/nodevol/volume"
)

// KeptPod is what the inbox keeps of a pod between AddPod and DeletePod,
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
// the volumes PodVolumes selects (those a container mounts or maps and a
// registered plugin handles, or that fail to resolve); and of each
// container (init, regular, ephemeral) that mounts or maps one of those
// volumes, the names of those mounts and devices and its seLinuxOptions;
// and what the volumes show or are sized by (kept, whatToKeep).
// Every function that reads a pod in this package gives the same answer
// for Keep(pod).pod() as for the pod (TestTrimPod).
type KeptPod struct {
	uid                             types.UID
	namespace, name, serviceAccount string
	securityContext                 *v1.PodSecurityContext
	volumes                         []v1.Volume
	containers                      []keptContainer
	// resources, overhead and qos (its status's QoS class) are the
	// pod's, when it keeps limits.
	resources *v1.ResourceRequirements
	overhead  v1.ResourceList
	qos       v1.PodQOSClass
	// labels and annotations are the pod's, when a downward API file
	// shows them.
	labels, annotations map[string]string
}

// keptContainer is what KeptPod keeps of a container.
type keptContainer struct {
	kind            containerKind
	name            string
	mounts, devices []string
	seLinux         *v1.SELinuxOptions
	// limits and requests are the container's cpu, memory and hugepage
	// ones (sizing), and restartPolicy an init container's (a sidecar's
	// Always), when the pod keeps limits; all its limits and requests
	// when a downward API file shows a container's resources.
	limits, requests v1.ResourceList
	restartPolicy    *v1.ContainerRestartPolicy
}

type containerKind uint8

const (
	initContainer containerKind = iota
	regularContainer
	ephemeralContainer
)

// Keep returns what the inbox keeps of pod, sharing no memory with it.
func Keep(pod *v1.Pod, plugins *volume.Registry) *KeptPod {
	k := &KeptPod{uid: pod.UID, namespace: pod.Namespace, name: pod.Name, serviceAccount: pod.Spec.ServiceAccountName}
	if sc := pod.Spec.SecurityContext; sc != nil {
		k.securityContext = (&v1.PodSecurityContext{
			FSGroup:             sc.FSGroup,
			FSGroupChangePolicy: sc.FSGroupChangePolicy,
			SELinuxOptions:      sc.SELinuxOptions,
			SELinuxChangePolicy: sc.SELinuxChangePolicy,
		}).DeepCopy() // no pointer into the caller's pod
	}
	vols := PodVolumes(pod, plugins)
	if len(vols) == 0 {
		return k
	}
	more := whatToKeep(vols)
	limits := more.limits || more.resources
	if limits {
		k.resources, k.overhead, k.qos = pod.Spec.Resources.DeepCopy(), pod.Spec.Overhead.DeepCopy(), pod.Status.QOSClass
	}
	if more.meta {
		k.labels, k.annotations = maps.Clone(pod.Labels), maps.Clone(pod.Annotations)
	}
	if u := atomicwriter.FSUser(pod); more.user && u != nil {
		// The user every container runs as, which owns a projected
		// volume's token files, as the pod's own: FSUser gives it back
		// from the kept copy, whose containers carry no user.
		if k.securityContext == nil {
			k.securityContext = &v1.PodSecurityContext{}
		}
		k.securityContext.RunAsUser = ptr.To(*u)
	}
	keep := make(map[string]bool, len(vols))
	k.volumes = make([]v1.Volume, len(vols))
	for i := range vols {
		keep[vols[i].Name] = true
		vols[i].DeepCopyInto(&k.volumes[i])
	}
	ck := containerKeeper{more: more, limits: limits, volumes: keep}
	add := func(kind containerKind, name string, ms []v1.VolumeMount, ds []v1.VolumeDevice, sc *v1.SecurityContext, r *v1.ResourceRequirements, rp *v1.ContainerRestartPolicy) {
		if c, ok := ck.keep(kind, name, ms, ds, sc, r, rp); ok {
			k.containers = append(k.containers, c)
		}
	}
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		add(initContainer, c.Name, c.VolumeMounts, c.VolumeDevices, c.SecurityContext, &c.Resources, c.RestartPolicy)
	}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		add(regularContainer, c.Name, c.VolumeMounts, c.VolumeDevices, c.SecurityContext, &c.Resources, nil)
	}
	for i := range pod.Spec.EphemeralContainers {
		c := &pod.Spec.EphemeralContainers[i]
		// Ephemeral containers cannot have volumeDevices; their mounts count.
		// Ephemeral containers have no resources.
		add(ephemeralContainer, c.Name, c.VolumeMounts, nil, c.SecurityContext, &v1.ResourceRequirements{}, nil)
	}
	return k
}

// kept says what more than the volumes a pod keeps.
type kept struct {
	// limits: the cpu, memory and hugepage limits and requests, which
	// size a tmpfs (an emptyDir in memory or hugepages, a secret or
	// projected volume);
	// resources: every container's limits and requests, which a
	// downward API file shows (resourceFieldRef); meta: the labels and
	// annotations a downward API file shows (fieldRef); user: the user
	// all containers run as, which owns a projected volume's files.
	limits, resources, meta, user bool
}

// containerKeeper keeps what nodevol reads of a pod's containers: their
// mounts and devices of the kept volumes, their SELinux options, and their
// resources when the pod's volumes need them (kept).
type containerKeeper struct {
	more kept
	// limits: the containers' limits are kept (their requests too, shared
	// when equal).
	limits bool
	// volumes are the names of the kept volumes.
	volumes map[string]bool
}

// keep returns what is kept of a container, false when nothing is: it uses
// none of the kept volumes and no resources are kept.
func (ck containerKeeper) keep(kind containerKind, name string, ms []v1.VolumeMount, ds []v1.VolumeDevice, sc *v1.SecurityContext, r *v1.ResourceRequirements, rp *v1.ContainerRestartPolicy) (keptContainer, bool) {
	c := keptContainer{kind: kind, name: name}
	switch {
	case ck.more.resources:
		c.limits, c.requests, c.restartPolicy = r.Limits.DeepCopy(), r.Requests.DeepCopy(), rp
	case ck.limits:
		c.limits, c.restartPolicy = sizing(r.Limits), rp
		c.requests = c.limits // the usual case (requests defaulted from limits): one copy, shared
		if !sizesEqual(c.limits, r.Requests) {
			c.requests = sizing(r.Requests)
		}
	}
	for _, m := range ms {
		if ck.volumes[m.Name] {
			c.mounts = append(c.mounts, m.Name)
		}
	}
	for _, d := range ds {
		if ck.volumes[d.Name] {
			c.devices = append(c.devices, d.Name)
		}
	}
	if c.mounts == nil && c.devices == nil && !ck.limits {
		return c, false // the container uses none of nodevol's volumes
	}
	if sc != nil && sc.SELinuxOptions != nil {
		c.seLinux = sc.SELinuxOptions.DeepCopy()
	}
	return c, true
}

// whatToKeep says what a pod with these volumes keeps beside them.
func whatToKeep(vols []PodVolume) kept {
	var k kept
	downward := func(items []v1.DownwardAPIVolumeFile) {
		for _, it := range items {
			k.meta = k.meta || it.FieldRef != nil
			k.resources = k.resources || it.ResourceFieldRef != nil
		}
	}
	for _, v := range vols {
		switch {
		case v.EmptyDir != nil:
			k.limits = k.limits || v.EmptyDir.Medium != v1.StorageMediumDefault
		case v.Secret != nil:
			k.limits = true
		case v.DownwardAPI != nil:
			downward(v.DownwardAPI.Items)
		case v.Projected != nil:
			k.limits, k.user = true, true
			for _, s := range v.Projected.Sources {
				if s.DownwardAPI != nil {
					downward(s.DownwardAPI.Items)
				}
			}
		}
	}
	return k
}

// sizing is what of a container's limits or requests sizes a tmpfs,
// nil when none: memory and hugepages (a memory volume's size, a hugepages
// volume's page size, read from the requests the API server defaults from
// limits) and cpu, which with memory makes the pod's QoS class, on which
// the memory bound depends.
func sizing(l v1.ResourceList) v1.ResourceList {
	var out v1.ResourceList
	for name, q := range l {
		if sizes(name) {
			if out == nil {
				out = v1.ResourceList{}
			}
			out[name] = q.DeepCopy()
		}
	}
	return out
}

// sizes reports whether a resource is one sizing keeps.
func sizes(name v1.ResourceName) bool {
	return name == v1.ResourceMemory || name == v1.ResourceCPU || strings.HasPrefix(string(name), v1.ResourceHugePagesPrefix)
}

// sizesEqual reports whether l, a sizing list, is what sizing(r) would
// make, without making it.
func sizesEqual(l, r v1.ResourceList) bool {
	n := 0
	for name, q := range r {
		if !sizes(name) {
			continue
		}
		n++
		if o, ok := l[name]; !ok || q.Cmp(o) != 0 {
			return false
		}
	}
	return n == len(l)
}

// Pod returns the kept pod as a v1.Pod; nil for nil (a deleted pod). It
// shares memory with k: its readers do not write.
func (k *KeptPod) Pod() *v1.Pod {
	if k == nil {
		return nil
	}
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: k.name, Namespace: k.namespace, UID: k.uid, Labels: k.labels, Annotations: k.annotations},
		Spec: v1.PodSpec{ServiceAccountName: k.serviceAccount, SecurityContext: k.securityContext, Volumes: k.volumes,
			Resources: k.resources, Overhead: k.overhead},
		Status: v1.PodStatus{QOSClass: k.qos},
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
			p.Spec.InitContainers = append(p.Spec.InitContainers, v1.Container{Name: c.name, VolumeMounts: ms, VolumeDevices: ds, SecurityContext: sc,
				Resources: v1.ResourceRequirements{Limits: c.limits, Requests: c.requests}, RestartPolicy: c.restartPolicy})
		case regularContainer:
			p.Spec.Containers = append(p.Spec.Containers, v1.Container{Name: c.name, VolumeMounts: ms, VolumeDevices: ds, SecurityContext: sc,
				Resources: v1.ResourceRequirements{Limits: c.limits, Requests: c.requests}})
		case ephemeralContainer:
			p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, v1.EphemeralContainer{
				EphemeralContainerCommon: v1.EphemeralContainerCommon{Name: c.name, VolumeMounts: ms, SecurityContext: sc}})
		}
	}
	return p
}

// UID is the kept pod's UID.
func (k *KeptPod) UID() types.UID { return k.uid }

// Name is the kept pod's "namespace/name".
func (k *KeptPod) Name() string { return k.namespace + "/" + k.name }
