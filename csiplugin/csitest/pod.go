package csitest

import (
	"maps"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// PodOption changes a Pod that Pod builds.
type PodOption func(*v1.Pod)

// Pod returns a pending pod on node DefaultNodeID with one container,
// "app", and a UID derived from its namespace and name. Volume options add the
// volume and mount it (or map it, for block) into the container at
// /mnt/{volName} (or /dev/{volName}). Its volumes get the API server's
// defaults (setVolumeDefaults), as a pod read from the API has them: a
// volume added to the pod afterwards is left raw.
func Pod(namespace, name string, opts ...PodOption) *v1.Pod {
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: uidFor("Pod", namespace, name)},
		Spec: v1.PodSpec{
			NodeName:   DefaultNodeID,
			Containers: []v1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}},
		},
		Status: v1.PodStatus{Phase: v1.PodPending},
	}
	for _, o := range opts {
		o(pod)
	}
	for i := range pod.Spec.Volumes {
		// A copy: the options' volumes may share sources with the caller's.
		v := pod.Spec.Volumes[i].DeepCopy()
		setVolumeDefaults(v)
		pod.Spec.Volumes[i] = *v
	}
	return pod
}

// PodUID sets the UID.
func PodUID(uid types.UID) PodOption {
	return func(p *v1.Pod) { p.UID = uid }
}

// PodNode sets spec.nodeName.
func PodNode(node string) PodOption {
	return func(p *v1.Pod) { p.Spec.NodeName = node }
}

// PodFSGroup sets the pod security context's fsGroup.
func PodFSGroup(gid int64) PodOption {
	return func(p *v1.Pod) {
		if p.Spec.SecurityContext == nil {
			p.Spec.SecurityContext = &v1.PodSecurityContext{}
		}
		p.Spec.SecurityContext.FSGroup = &gid
	}
}

// PodServiceAccount sets spec.serviceAccountName.
func PodServiceAccount(name string) PodOption {
	return func(p *v1.Pod) { p.Spec.ServiceAccountName = name }
}

// WithVolume adds vol and mounts it into the container at /mnt/{name}.
func WithVolume(vol v1.Volume, readOnly bool) PodOption {
	return func(p *v1.Pod) {
		p.Spec.Volumes = append(p.Spec.Volumes, vol)
		c := &p.Spec.Containers[0]
		c.VolumeMounts = append(c.VolumeMounts, v1.VolumeMount{Name: vol.Name, MountPath: "/mnt/" + vol.Name, ReadOnly: readOnly})
	}
}

// WithPVC adds volume volName using claim claimName and mounts it.
func WithPVC(volName, claimName string, readOnly bool) PodOption {
	return WithVolume(v1.Volume{
		Name: volName,
		VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{
			ClaimName: claimName, ReadOnly: readOnly,
		}},
	}, readOnly)
}

// WithBlockPVC adds volume volName using claim claimName (a Block mode
// claim) and maps it into the container as device /dev/{volName}.
func WithBlockPVC(volName, claimName string, readOnly bool) PodOption {
	return func(p *v1.Pod) {
		p.Spec.Volumes = append(p.Spec.Volumes, v1.Volume{
			Name: volName,
			VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{
				ClaimName: claimName, ReadOnly: readOnly,
			}},
		})
		c := &p.Spec.Containers[0]
		c.VolumeDevices = append(c.VolumeDevices, v1.VolumeDevice{Name: volName, DevicePath: "/dev/" + volName})
	}
}

// WithInlineCSI adds an inline (CSI ephemeral) volume volName of driver
// with volumeAttributes attributes (copied) and mounts it.
func WithInlineCSI(volName, driver string, readOnly bool, attributes map[string]string) PodOption {
	return WithVolume(v1.Volume{
		Name: volName,
		VolumeSource: v1.VolumeSource{CSI: &v1.CSIVolumeSource{
			Driver: driver, ReadOnly: &readOnly, VolumeAttributes: maps.Clone(attributes),
		}},
	}, readOnly)
}

// WithEphemeral adds a generic ephemeral volume volName whose claim
// template asks storageClass for a ReadWriteOnce 1Gi filesystem,
// and mounts it. Its claim is named EphemeralClaimName(pod, volName) and
// must be controlled by the pod (PVCOwnedBy).
func WithEphemeral(volName, storageClass string) PodOption {
	return WithVolume(v1.Volume{
		Name: volName,
		VolumeSource: v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{
			VolumeClaimTemplate: &v1.PersistentVolumeClaimTemplate{Spec: v1.PersistentVolumeClaimSpec{
				AccessModes:      []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
				StorageClassName: &storageClass,
				Resources: v1.VolumeResourceRequirements{
					Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse(defaultSize)},
				},
			}},
		}},
	}, false)
}

// EphemeralClaimName is the name of the claim of a pod's generic ephemeral
// volume: "{pod name}-{volume name}".
func EphemeralClaimName(pod *v1.Pod, volName string) string {
	return pod.Name + "-" + volName
}
