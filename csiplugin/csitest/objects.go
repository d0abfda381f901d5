package csitest

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"slices"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The builders below return objects as the API server would store them
// (defaults filled in, UIDs set), because the fake clientset applies no
// defaults. UIDs are derived from kind, namespace and name, so a test that
// builds the same object twice gets the same UID.

// defaultSize is the capacity of the volumes and claims the builders make.
const defaultSize = "1Gi"

// uidFor returns a UID derived from an object's kind, namespace and name,
// formatted like the API server's random ones.
func uidFor(kind, namespace, name string) types.UID {
	sum := sha256.Sum256([]byte(kind + "/" + namespace + "/" + name))
	h := hex.EncodeToString(sum[:16])
	return types.UID(h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32])
}

// attachmentName is the name of the VolumeAttachment for a volume handle,
// driver and node: "csi-" and the hex SHA-256 of the three concatenated,
// the formula of the kubelet and the attach-detach controller
// (csiplugin.AttachmentName, which csitest cannot import).
func attachmentName(volumeHandle, driver, node string) string {
	sum := sha256.Sum256([]byte(volumeHandle + driver + node))
	return "csi-" + hex.EncodeToString(sum[:])
}

// PVSpec describes a CSI PersistentVolume for PV and BoundClaim. Every
// field's zero value is the default stated on it, so a literal names only
// what a test cares about.
type PVSpec struct {
	// Driver is the CSI source's driver, e.g. Server.DriverName().
	Driver string
	// Handle is the CSI source's volumeHandle: the driver's volume ID.
	Handle string
	// Capacity is the size, e.g. "10Gi" (PV panics on a bad quantity).
	// Default "1Gi".
	Capacity string
	// AccessModes default to ReadWriteOnce.
	AccessModes []v1.PersistentVolumeAccessMode
	// Block makes a raw block volume (volumeMode Block); default
	// Filesystem.
	Block bool
	// FSType, ReadOnly and Attributes (copied) are the CSI source's
	// fsType, readOnly and volumeAttributes.
	FSType     string
	ReadOnly   bool
	Attributes map[string]string
	// MountOptions are the volume's mount options.
	MountOptions []string
	// The CSI source's secret references; nil: none.
	NodeStageSecret         *v1.SecretReference
	NodePublishSecret       *v1.SecretReference
	NodeExpandSecret        *v1.SecretReference
	ControllerPublishSecret *v1.SecretReference
}

// PV returns the CSI PersistentVolume that spec describes, with reclaim
// policy Delete and phase Available.
func PV(name string, spec PVSpec) *v1.PersistentVolume {
	return buildPV(name, spec, nil)
}

// buildPV returns the volume of spec, bound to claimRef (phase Bound) when
// it is not nil.
func buildPV(name string, spec PVSpec, claimRef *v1.ObjectReference) *v1.PersistentVolume {
	size := cmp.Or(spec.Capacity, defaultSize)
	modes := []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}
	if spec.AccessModes != nil {
		modes = slices.Clone(spec.AccessModes)
	}
	mode, phase := v1.PersistentVolumeFilesystem, v1.VolumeAvailable
	if spec.Block {
		mode = v1.PersistentVolumeBlock
	}
	if claimRef != nil {
		phase = v1.VolumeBound
	}
	return &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: uidFor("PersistentVolume", "", name)},
		Spec: v1.PersistentVolumeSpec{
			Capacity:    v1.ResourceList{v1.ResourceStorage: resource.MustParse(size)},
			AccessModes: modes,
			PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{
				Driver:                     spec.Driver,
				VolumeHandle:               spec.Handle,
				FSType:                     spec.FSType,
				ReadOnly:                   spec.ReadOnly,
				VolumeAttributes:           maps.Clone(spec.Attributes),
				NodeStageSecretRef:         cloneRef(spec.NodeStageSecret),
				NodePublishSecretRef:       cloneRef(spec.NodePublishSecret),
				NodeExpandSecretRef:        cloneRef(spec.NodeExpandSecret),
				ControllerPublishSecretRef: cloneRef(spec.ControllerPublishSecret),
			}},
			PersistentVolumeReclaimPolicy: v1.PersistentVolumeReclaimDelete,
			MountOptions:                  slices.Clone(spec.MountOptions),
			VolumeMode:                    &mode,
			ClaimRef:                      claimRef,
		},
		Status: v1.PersistentVolumeStatus{Phase: phase},
	}
}

func cloneRef(r *v1.SecretReference) *v1.SecretReference {
	if r == nil {
		return nil
	}
	c := *r
	return &c
}

// PVC returns a claim bound to the volume pvName: spec.volumeName set,
// phase Bound, 1Gi requested and granted, ReadWriteOnce, Filesystem mode.
// With pvName "" the claim is unbound: phase Pending, no status capacity
// or access modes. Its UID is derived from its namespace and name, so a
// test can build the same claim twice. BoundClaim builds a claim together
// with its volume.
func PVC(namespace, name, pvName string) *v1.PersistentVolumeClaim {
	fs := v1.PersistentVolumeFilesystem
	size := resource.MustParse(defaultSize)
	pvc := &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: namespace, Name: name,
			UID: uidFor("PersistentVolumeClaim", namespace, name),
		},
		Spec: v1.PersistentVolumeClaimSpec{
			AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			Resources: v1.VolumeResourceRequirements{
				Requests: v1.ResourceList{v1.ResourceStorage: size},
			},
			VolumeName: pvName,
			VolumeMode: &fs,
		},
		Status: v1.PersistentVolumeClaimStatus{
			Phase:       v1.ClaimBound,
			AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			Capacity:    v1.ResourceList{v1.ResourceStorage: size},
		},
	}
	if pvName == "" {
		pvc.Status = v1.PersistentVolumeClaimStatus{Phase: v1.ClaimPending}
	}
	return pvc
}

// BoundClaim returns a claim and the CSI volume bound to it, consistent
// with each other: the volume (described by pv) is named "pvc-" + the
// claim's UID (as the external-provisioner names them), its claimRef
// carries the claim's UID, and the claim's volumeName, access modes,
// volume mode and capacity are the volume's. They suit a fake clientset as
// they are; through a real API server, which gives the claim a UID of its
// own, create them with CreateBound.
func BoundClaim(namespace, name string, pv PVSpec) (*v1.PersistentVolumeClaim, *v1.PersistentVolume) {
	uid := uidFor("PersistentVolumeClaim", namespace, name)
	vol := buildPV("pvc-"+string(uid), pv, &v1.ObjectReference{
		Kind: "PersistentVolumeClaim", APIVersion: "v1",
		Namespace: namespace, Name: name, UID: uid,
	})
	pvc := PVC(namespace, name, vol.Name)
	pvc.Spec.AccessModes = slices.Clone(vol.Spec.AccessModes)
	pvc.Status.AccessModes = slices.Clone(vol.Spec.AccessModes)
	mode := *vol.Spec.VolumeMode
	pvc.Spec.VolumeMode = &mode
	pvc.Spec.Resources.Requests = vol.Spec.Capacity.DeepCopy()
	pvc.Status.Capacity = vol.Spec.Capacity.DeepCopy()
	return pvc, vol
}

// EphemeralClaim returns the claim of the generic ephemeral volume volName
// of pod, and the CSI volume (described by pv) bound to it, as BoundClaim
// builds them: the claim is named "{pod name}-{volume name}" and
// controlled by the pod, as the ephemeral volume controller makes it.
func EphemeralClaim(pod *v1.Pod, volName string, pv PVSpec) (*v1.PersistentVolumeClaim, *v1.PersistentVolume) {
	pvc, vol := BoundClaim(pod.Namespace, pod.Name+"-"+volName, pv)
	yes := true
	pvc.OwnerReferences = append(pvc.OwnerReferences, metav1.OwnerReference{
		APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID,
		Controller: &yes, BlockOwnerDeletion: &yes,
	})
	return pvc, vol
}

// CSIDriverSpec describes a CSIDriver object for CSIDriver. Every field's
// zero value is the default stated on it.
type CSIDriverSpec struct {
	// AttachRequired: the driver needs VolumeAttachments (a controller
	// that attaches). Default false, like Server.
	AttachRequired bool
	// PodInfoOnMount, RequiresRepublish and SELinuxMount set the fields
	// of those names. Default false.
	PodInfoOnMount    bool
	RequiresRepublish bool
	SELinuxMount      bool
	// FSGroupPolicy defaults to ReadWriteOnceWithFSType.
	FSGroupPolicy storagev1.FSGroupPolicy
	// LifecycleModes are volumeLifecycleModes, e.g. Ephemeral for a
	// driver of inline volumes. Default [Persistent].
	LifecycleModes []storagev1.VolumeLifecycleMode
}

// CSIDriver returns the CSIDriver object that spec describes, with the API
// server's defaults where spec says nothing (storageCapacity false).
func CSIDriver(name string, spec CSIDriverSpec) *storagev1.CSIDriver {
	modes := []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent}
	if spec.LifecycleModes != nil {
		modes = slices.Clone(spec.LifecycleModes)
	}
	return &storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: uidFor("CSIDriver", "", name)},
		Spec: storagev1.CSIDriverSpec{
			AttachRequired:       ptr(spec.AttachRequired),
			PodInfoOnMount:       ptr(spec.PodInfoOnMount),
			RequiresRepublish:    ptr(spec.RequiresRepublish),
			StorageCapacity:      ptr(false),
			SELinuxMount:         ptr(spec.SELinuxMount),
			FSGroupPolicy:        ptr(cmp.Or(spec.FSGroupPolicy, storagev1.ReadWriteOnceWithFSTypeFSGroupPolicy)),
			VolumeLifecycleModes: modes,
		},
	}
}

func ptr[T any](v T) *T { return &v }

// Secret returns an Opaque secret holding data.
func Secret(namespace, name string, data map[string]string) *v1.Secret {
	s := &v1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: uidFor("Secret", namespace, name)},
		Type:       v1.SecretTypeOpaque,
		Data:       make(map[string][]byte, len(data)),
	}
	for k, v := range data {
		s.Data[k] = []byte(v)
	}
	return s
}

// VolumeAttachment returns the VolumeAttachment of PV pvName on node, for
// driver. With attached set its status says attached, as the
// external-attacher leaves it. csiplugin.AttachmentName is the name the
// kubelet looks for; AttachVolume creates the one of a PV under that name.
func VolumeAttachment(name, driver, pvName, node string, attached bool) *storagev1.VolumeAttachment {
	return &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: uidFor("VolumeAttachment", "", name)},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: driver,
			Source:   storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName},
			NodeName: node,
		},
		Status: storagev1.VolumeAttachmentStatus{Attached: attached},
	}
}
