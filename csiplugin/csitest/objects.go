package csitest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"

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

// AttachmentName is the name of the VolumeAttachment for a volume handle,
// driver and node: "csi-" and the hex SHA-256 of the three concatenated,
// the formula of the kubelet and the attach-detach controller.
func AttachmentName(volumeHandle, driver, node string) string {
	sum := sha256.Sum256([]byte(volumeHandle + driver + node))
	return "csi-" + hex.EncodeToString(sum[:])
}

// PVOption changes a PersistentVolume that PV or BoundClaim builds.
type PVOption func(*v1.PersistentVolume)

// PV returns a CSI PersistentVolume of driver with volume handle handle:
// 1Gi, ReadWriteOnce, Filesystem mode, reclaim policy Delete. Its phase
// is Bound when it has a claimRef (as BoundClaim gives it) and Available
// otherwise.
func PV(name, driver, handle string, opts ...PVOption) *v1.PersistentVolume {
	fs := v1.PersistentVolumeFilesystem
	pv := &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: uidFor("PersistentVolume", "", name)},
		Spec: v1.PersistentVolumeSpec{
			Capacity:    v1.ResourceList{v1.ResourceStorage: resource.MustParse(defaultSize)},
			AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			PersistentVolumeSource: v1.PersistentVolumeSource{
				CSI: &v1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: handle},
			},
			PersistentVolumeReclaimPolicy: v1.PersistentVolumeReclaimDelete,
			VolumeMode:                    &fs,
		},
	}
	for _, o := range opts {
		o(pv)
	}
	if pv.Status.Phase == "" {
		pv.Status.Phase = v1.VolumeAvailable
		if pv.Spec.ClaimRef != nil {
			pv.Status.Phase = v1.VolumeBound
		}
	}
	return pv
}

// PVCapacity sets the capacity, e.g. "10Gi". It panics on a bad quantity.
func PVCapacity(size string) PVOption {
	return func(pv *v1.PersistentVolume) {
		pv.Spec.Capacity = v1.ResourceList{v1.ResourceStorage: resource.MustParse(size)}
	}
}

// PVAccessModes sets the access modes.
func PVAccessModes(modes ...v1.PersistentVolumeAccessMode) PVOption {
	return func(pv *v1.PersistentVolume) { pv.Spec.AccessModes = modes }
}

// PVBlock makes a raw block volume (volumeMode Block).
func PVBlock() PVOption {
	return func(pv *v1.PersistentVolume) {
		block := v1.PersistentVolumeBlock
		pv.Spec.VolumeMode = &block
	}
}

// PVFSType sets the CSI source's fsType.
func PVFSType(fsType string) PVOption {
	return func(pv *v1.PersistentVolume) { pv.Spec.CSI.FSType = fsType }
}

// pvReadOnly sets the CSI source's readOnly.
func pvReadOnly() PVOption {
	return func(pv *v1.PersistentVolume) { pv.Spec.CSI.ReadOnly = true }
}

// PVMountOptions sets the mount options.
func PVMountOptions(options ...string) PVOption {
	return func(pv *v1.PersistentVolume) { pv.Spec.MountOptions = options }
}

// pvAttributes sets the CSI source's volumeAttributes (copied).
func pvAttributes(attributes map[string]string) PVOption {
	return func(pv *v1.PersistentVolume) { pv.Spec.CSI.VolumeAttributes = maps.Clone(attributes) }
}

// pvNodeStageSecret sets the CSI source's nodeStageSecretRef.
func pvNodeStageSecret(namespace, name string) PVOption {
	return func(pv *v1.PersistentVolume) { pv.Spec.CSI.NodeStageSecretRef = secretRef(namespace, name) }
}

// PVNodePublishSecret sets the CSI source's nodePublishSecretRef.
func PVNodePublishSecret(namespace, name string) PVOption {
	return func(pv *v1.PersistentVolume) { pv.Spec.CSI.NodePublishSecretRef = secretRef(namespace, name) }
}

// pvNodeExpandSecret sets the CSI source's nodeExpandSecretRef.
func pvNodeExpandSecret(namespace, name string) PVOption {
	return func(pv *v1.PersistentVolume) { pv.Spec.CSI.NodeExpandSecretRef = secretRef(namespace, name) }
}

// pvControllerPublishSecret sets the CSI source's
// controllerPublishSecretRef.
func pvControllerPublishSecret(namespace, name string) PVOption {
	return func(pv *v1.PersistentVolume) { pv.Spec.CSI.ControllerPublishSecretRef = secretRef(namespace, name) }
}

func secretRef(namespace, name string) *v1.SecretReference {
	return &v1.SecretReference{Namespace: namespace, Name: name}
}

// pvClaimRef binds the volume to a claim (and makes its phase Bound). The
// uid must be the claim's for the kubelet to accept the binding; PVC and
// BoundClaim use uidFor("PersistentVolumeClaim", namespace, name).
func pvClaimRef(namespace, name string, uid types.UID) PVOption {
	return func(pv *v1.PersistentVolume) {
		pv.Spec.ClaimRef = &v1.ObjectReference{
			Kind: "PersistentVolumeClaim", APIVersion: "v1",
			Namespace: namespace, Name: name, UID: uid,
		}
	}
}

// PVCOption changes a PersistentVolumeClaim that PVC builds.
type PVCOption func(*v1.PersistentVolumeClaim)

// PVC returns a claim bound to the volume pvName: spec.volumeName set,
// phase Bound, 1Gi requested and granted, ReadWriteOnce, Filesystem
// mode. Its UID is derived from its namespace and name, so a test can
// build the same claim twice.
func PVC(namespace, name, pvName string, opts ...PVCOption) *v1.PersistentVolumeClaim {
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
	for _, o := range opts {
		o(pvc)
	}
	return pvc
}

// PVCPending makes the claim unbound: no volumeName, phase Pending, no
// status capacity or access modes.
func PVCPending() PVCOption {
	return func(pvc *v1.PersistentVolumeClaim) {
		pvc.Spec.VolumeName = ""
		pvc.Status = v1.PersistentVolumeClaimStatus{Phase: v1.ClaimPending}
	}
}

// PVCBlock makes the claim ask for a raw block volume (volumeMode Block).
func PVCBlock() PVCOption {
	return func(pvc *v1.PersistentVolumeClaim) {
		block := v1.PersistentVolumeBlock
		pvc.Spec.VolumeMode = &block
	}
}

// pvcUID sets the UID.
func pvcUID(uid types.UID) PVCOption {
	return func(pvc *v1.PersistentVolumeClaim) { pvc.UID = uid }
}

// PVCOwnedBy makes pod the claim's controller, as for the claim of a
// generic ephemeral volume (see WithEphemeral).
func PVCOwnedBy(pod *v1.Pod) PVCOption {
	return func(pvc *v1.PersistentVolumeClaim) {
		yes := true
		pvc.OwnerReferences = append(pvc.OwnerReferences, metav1.OwnerReference{
			APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID,
			Controller: &yes, BlockOwnerDeletion: &yes,
		})
	}
}

// BoundClaim returns a claim and the CSI volume bound to it, consistent
// with each other: the volume is named "pvc-" + the claim's UID (as the
// external-provisioner names them), its claimRef carries the claim's UID,
// and the claim's volumeName, access modes, volume mode and capacity are the
// volume's. opts change the volume before the claim is made from it.
// They suit a fake clientset as they are; through a real API server,
// which gives the claim a UID of its own, create them with CreateBound
// (or use CreateBoundClaim).
func BoundClaim(namespace, name, driver, handle string, opts ...PVOption) (*v1.PersistentVolumeClaim, *v1.PersistentVolume) {
	uid := uidFor("PersistentVolumeClaim", namespace, name)
	pv := PV("pvc-"+string(uid), driver, handle, append([]PVOption{pvClaimRef(namespace, name, uid)}, opts...)...)
	pvc := PVC(namespace, name, pv.Name, pvcUID(uid), func(pvc *v1.PersistentVolumeClaim) {
		pvc.Spec.AccessModes = append([]v1.PersistentVolumeAccessMode(nil), pv.Spec.AccessModes...)
		pvc.Status.AccessModes = append([]v1.PersistentVolumeAccessMode(nil), pv.Spec.AccessModes...)
		mode := *pv.Spec.VolumeMode
		pvc.Spec.VolumeMode = &mode
		pvc.Spec.Resources.Requests = pv.Spec.Capacity.DeepCopy()
		pvc.Status.Capacity = pv.Spec.Capacity.DeepCopy()
	})
	return pvc, pv
}

// CSIDriverOption changes a CSIDriver that CSIDriver builds.
type CSIDriverOption func(*storagev1.CSIDriver)

// CSIDriver returns a CSIDriver object with the API server's defaults:
// podInfoOnMount, requiresRepublish, storageCapacity and seLinuxMount
// false, fsGroupPolicy ReadWriteOnceWithFSType, lifecycle mode Persistent.
func CSIDriver(name string, attachRequired bool, opts ...CSIDriverOption) *storagev1.CSIDriver {
	no := false
	policy := storagev1.ReadWriteOnceWithFSTypeFSGroupPolicy
	d := &storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: uidFor("CSIDriver", "", name)},
		Spec: storagev1.CSIDriverSpec{
			AttachRequired:       &attachRequired,
			PodInfoOnMount:       &no,
			RequiresRepublish:    &no,
			StorageCapacity:      &no,
			SELinuxMount:         &no,
			FSGroupPolicy:        &policy,
			VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent},
		},
	}
	for _, o := range opts {
		o(d)
	}
	return d
}

// DriverPodInfoOnMount sets podInfoOnMount.
func DriverPodInfoOnMount() CSIDriverOption {
	return func(d *storagev1.CSIDriver) { d.Spec.PodInfoOnMount = ptr(true) }
}

// DriverRequiresRepublish sets requiresRepublish.
func DriverRequiresRepublish() CSIDriverOption {
	return func(d *storagev1.CSIDriver) { d.Spec.RequiresRepublish = ptr(true) }
}

// DriverSELinuxMount sets seLinuxMount.
func DriverSELinuxMount() CSIDriverOption {
	return func(d *storagev1.CSIDriver) { d.Spec.SELinuxMount = ptr(true) }
}

// DriverLifecycleModes sets volumeLifecycleModes, e.g. Ephemeral for a
// driver of inline volumes.
func DriverLifecycleModes(modes ...storagev1.VolumeLifecycleMode) CSIDriverOption {
	return func(d *storagev1.CSIDriver) { d.Spec.VolumeLifecycleModes = modes }
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
// external-attacher leaves it. Use AttachmentName for the name the kubelet
// looks for.
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

// VolumeAttachmentFor returns the unattached VolumeAttachment that the
// attach-detach controller creates for a CSI volume on node, named with
// AttachmentName. It fails if pv has no CSI source.
func VolumeAttachmentFor(pv *v1.PersistentVolume, node string) (*storagev1.VolumeAttachment, error) {
	src := pv.Spec.CSI
	if src == nil {
		return nil, fmt.Errorf("csitest: persistent volume %s has no CSI source", pv.Name)
	}
	return VolumeAttachment(AttachmentName(src.VolumeHandle, src.Driver, node), src.Driver, pv.Name, node, false), nil
}
