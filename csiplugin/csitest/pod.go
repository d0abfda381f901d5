package csitest

import (
	"cmp"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// PodSpec describes a pod for Pod. Every field's zero value is the default
// stated on it.
type PodSpec struct {
	// UID defaults to one derived from the pod's namespace and name.
	UID types.UID
	// Node is spec.nodeName. Default DefaultNodeID.
	Node string
	// FSGroup is the pod security context's fsGroup. Default none.
	FSGroup *int64
	// ServiceAccount is spec.serviceAccountName. Default none.
	ServiceAccount string
	// Volumes are the pod's volumes, in order, each used by its container.
	Volumes []PodVolume
}

// PodVolume is a volume of a pod built by Pod and its use by the pod's
// one container: mounted at /mnt/{Name}, or mapped as device
// /dev/{Name} if Block.
type PodVolume struct {
	// Name is the volume's name.
	Name string
	// Claim, when set, makes the volume a persistentVolumeClaim volume of
	// that claim (readOnly as ReadOnly says), and Source is ignored.
	Claim string
	// Source is the volume's source when Claim is empty, e.g. an inline
	// CSI, emptyDir or configMap source.
	Source v1.VolumeSource
	// ReadOnly mounts the volume read-only.
	ReadOnly bool
	// Block maps the volume into the container as a raw block device
	// instead of mounting it: for a claim of a Block mode volume.
	Block bool
}

// Pod returns the pending pod that spec describes, with one container,
// "app", that uses every volume. Its volumes get the API server's defaults
// (setVolumeDefaults), as a pod read from the API has them: a volume added
// to the pod afterwards is left raw.
func Pod(namespace, name string, spec PodSpec) *v1.Pod {
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: namespace, Name: name,
			UID: cmp.Or(spec.UID, uidFor("Pod", namespace, name)),
		},
		Spec: v1.PodSpec{
			NodeName:           cmp.Or(spec.Node, DefaultNodeID),
			ServiceAccountName: spec.ServiceAccount,
			Containers:         []v1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}},
		},
		Status: v1.PodStatus{Phase: v1.PodPending},
	}
	if spec.FSGroup != nil {
		pod.Spec.SecurityContext = &v1.PodSecurityContext{FSGroup: ptr(*spec.FSGroup)}
	}
	c := &pod.Spec.Containers[0]
	for _, pv := range spec.Volumes {
		// A copy: the caller's sources may be shared with other pods.
		vol := (&v1.Volume{Name: pv.Name, VolumeSource: pv.Source}).DeepCopy()
		if pv.Claim != "" {
			vol.VolumeSource = v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{
				ClaimName: pv.Claim, ReadOnly: pv.ReadOnly,
			}}
		}
		setVolumeDefaults(vol)
		pod.Spec.Volumes = append(pod.Spec.Volumes, *vol)
		if pv.Block {
			c.VolumeDevices = append(c.VolumeDevices, v1.VolumeDevice{Name: pv.Name, DevicePath: "/dev/" + pv.Name})
		} else {
			c.VolumeMounts = append(c.VolumeMounts, v1.VolumeMount{Name: pv.Name, MountPath: "/mnt/" + pv.Name, ReadOnly: pv.ReadOnly})
		}
	}
	return pod
}
