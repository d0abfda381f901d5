package csitest

import (
	"crypto/sha256"
	"fmt"
	"regexp"
	"testing"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
)

func TestAttachmentName(t *testing.T) {
	// The kubelet's getAttachmentName, written out independently.
	want := fmt.Sprintf("csi-%x", sha256.Sum256([]byte("handle-1"+"drv.example.com"+"node-a")))
	if got := attachmentName("handle-1", "drv.example.com", "node-a"); got != want {
		t.Errorf("AttachmentName = %s, want %s", got, want)
	}
	if len(want) != len("csi-")+64 {
		t.Errorf("unexpected length %d", len(want))
	}
}

func TestUIDFor(t *testing.T) {
	uid := uidFor("Pod", "ns", "p")
	if !regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`).MatchString(string(uid)) {
		t.Errorf("UID %q is not UUID-shaped", uid)
	}
	if uid != uidFor("Pod", "ns", "p") {
		t.Error("uidFor is not deterministic")
	}
	for _, other := range []string{string(uidFor("PersistentVolumeClaim", "ns", "p")), string(uidFor("Pod", "ns2", "p")), string(uidFor("Pod", "ns", "q"))} {
		if other == string(uid) {
			t.Errorf("uidFor collides: %s", other)
		}
	}
}

func TestBoundClaimIsConsistent(t *testing.T) {
	tests := []struct {
		name string
		spec PVSpec
		mode v1.PersistentVolumeMode
	}{
		{name: "filesystem", spec: PVSpec{Driver: "drv", Handle: "h-1"}, mode: v1.PersistentVolumeFilesystem},
		{name: "block RWX 5Gi", spec: PVSpec{Driver: "drv", Handle: "h-1", Block: true, AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteMany}, Capacity: "5Gi"}, mode: v1.PersistentVolumeBlock},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pvc, pv := BoundClaim("ns", "data", tt.spec)
			if pvc.Spec.VolumeName != pv.Name || pvc.Status.Phase != v1.ClaimBound || pv.Status.Phase != v1.VolumeBound {
				t.Errorf("not bound: pvc volumeName %q phase %s, pv %q phase %s", pvc.Spec.VolumeName, pvc.Status.Phase, pv.Name, pv.Status.Phase)
			}
			ref := pv.Spec.ClaimRef
			if ref == nil || ref.UID != pvc.UID || ref.Name != pvc.Name || ref.Namespace != pvc.Namespace || pvc.UID == "" {
				t.Errorf("claimRef %+v does not match claim %s/%s %s", ref, pvc.Namespace, pvc.Name, pvc.UID)
			}
			if *pvc.Spec.VolumeMode != tt.mode || *pv.Spec.VolumeMode != tt.mode {
				t.Errorf("volume modes %s/%s, want %s", *pvc.Spec.VolumeMode, *pv.Spec.VolumeMode, tt.mode)
			}
			if fmt.Sprint(pvc.Spec.AccessModes) != fmt.Sprint(pv.Spec.AccessModes) || fmt.Sprint(pvc.Status.AccessModes) != fmt.Sprint(pv.Spec.AccessModes) {
				t.Errorf("access modes pvc %v/%v, pv %v", pvc.Spec.AccessModes, pvc.Status.AccessModes, pv.Spec.AccessModes)
			}
			pvSize, pvcSize := pv.Spec.Capacity[v1.ResourceStorage], pvc.Status.Capacity[v1.ResourceStorage]
			if pvSize.Cmp(pvcSize) != 0 {
				t.Errorf("capacity pv %s, pvc %s", pvSize.String(), pvcSize.String())
			}
			if pv.Spec.CSI.Driver != "drv" || pv.Spec.CSI.VolumeHandle != "h-1" {
				t.Errorf("CSI source %+v", pv.Spec.CSI)
			}
		})
	}
}

func TestPVSpec(t *testing.T) {
	ref := func(name string) *v1.SecretReference { return &v1.SecretReference{Namespace: "ns", Name: name} }
	pv := PV("pv1", PVSpec{Driver: "drv", Handle: "h", FSType: "xfs", ReadOnly: true, MountOptions: []string{"noatime"},
		Attributes: map[string]string{"a": "b"}, NodeStageSecret: ref("stage"),
		NodePublishSecret: ref("pub"), NodeExpandSecret: ref("exp"), ControllerPublishSecret: ref("ctl")})
	csi := pv.Spec.CSI
	if csi.FSType != "xfs" || !csi.ReadOnly || pv.Spec.MountOptions[0] != "noatime" || csi.VolumeAttributes["a"] != "b" {
		t.Errorf("source %+v", csi)
	}
	if csi.NodeStageSecretRef.Name != "stage" || csi.NodePublishSecretRef.Name != "pub" ||
		csi.NodeExpandSecretRef.Name != "exp" || csi.ControllerPublishSecretRef.Name != "ctl" {
		t.Errorf("secret refs %+v", csi)
	}
	if pv.Status.Phase != v1.VolumeAvailable || fmt.Sprint(pv.Spec.AccessModes) != "[ReadWriteOnce]" {
		t.Errorf("defaults: phase %s modes %v", pv.Status.Phase, pv.Spec.AccessModes)
	}
	if pending := PVC("ns", "c", ""); pending.Spec.VolumeName != "" || pending.Status.Phase != v1.ClaimPending {
		t.Errorf("pending claim %+v", pending)
	}
}

func TestPod(t *testing.T) {
	yes, gid, class := true, int64(1000), "fast"
	pod := Pod("ns", "p", PodSpec{FSGroup: &gid, ServiceAccount: "sa", Volumes: []PodVolume{
		{Name: "data", Claim: "claim"},
		{Name: "raw", Claim: "bclaim", ReadOnly: true, Block: true},
		{Name: "inline", Source: v1.VolumeSource{CSI: &v1.CSIVolumeSource{Driver: "drv", ReadOnly: &yes, VolumeAttributes: map[string]string{"k": "v"}}}, ReadOnly: true},
		{Name: "scratch", Source: v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{VolumeClaimTemplate: &v1.PersistentVolumeClaimTemplate{
			Spec: v1.PersistentVolumeClaimSpec{StorageClassName: &class}}}}},
	}})
	gid = 0 // the pod keeps its own copy
	if pod.UID != uidFor("Pod", "ns", "p") || pod.Spec.NodeName != DefaultNodeID {
		t.Errorf("uid %s node %s", pod.UID, pod.Spec.NodeName)
	}
	if len(pod.Spec.Volumes) != 4 {
		t.Fatalf("volumes %v", pod.Spec.Volumes)
	}
	c := pod.Spec.Containers[0]
	mounts := map[string]bool{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = true
	}
	if !mounts["data"] || !mounts["inline"] || !mounts["scratch"] || mounts["raw"] {
		t.Errorf("volumeMounts %v", c.VolumeMounts)
	}
	if len(c.VolumeDevices) != 1 || c.VolumeDevices[0].Name != "raw" {
		t.Errorf("volumeDevices %v", c.VolumeDevices)
	}
	if v := pod.Spec.Volumes[2].CSI; v == nil || v.Driver != "drv" || !*v.ReadOnly || v.VolumeAttributes["k"] != "v" {
		t.Errorf("inline volume %+v", v)
	}
	if *pod.Spec.SecurityContext.FSGroup != 1000 || pod.Spec.ServiceAccountName != "sa" {
		t.Error("fsGroup or service account")
	}
	if m := c.VolumeMounts[1]; m.Name != "inline" || !m.ReadOnly || m.MountPath != "/mnt/inline" {
		t.Errorf("inline mount %+v", m)
	}
	if src := pod.Spec.Volumes[1].PersistentVolumeClaim; src == nil || src.ClaimName != "bclaim" || !src.ReadOnly {
		t.Errorf("block claim source %+v", src)
	}
	if other := Pod("ns", "q", PodSpec{UID: "u-1", Node: "n-2"}); other.UID != "u-1" || other.Spec.NodeName != "n-2" || other.Spec.SecurityContext != nil || other.Spec.Volumes != nil {
		t.Errorf("UID and Node: %+v", other)
	}
	claim, _ := EphemeralClaim(pod, "scratch", PVSpec{Driver: "drv", Handle: "h"})
	if !metav1.IsControlledBy(claim, pod) || claim.Name != "p-scratch" || claim.Namespace != pod.Namespace {
		t.Errorf("ephemeral claim %s owners %v", claim.Name, claim.OwnerReferences)
	}
}

func TestCSIDriverAndMisc(t *testing.T) {
	d := CSIDriver("drv", CSIDriverSpec{AttachRequired: true, PodInfoOnMount: true, LifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecycleEphemeral}})
	if !*d.Spec.AttachRequired || !*d.Spec.PodInfoOnMount || *d.Spec.RequiresRepublish ||
		*d.Spec.FSGroupPolicy != storagev1.ReadWriteOnceWithFSTypeFSGroupPolicy ||
		d.Spec.VolumeLifecycleModes[0] != storagev1.VolumeLifecycleEphemeral {
		t.Errorf("driver %+v", d.Spec)
	}
	if s := Secret("ns", "s", map[string]string{"user": "u"}); string(s.Data["user"]) != "u" {
		t.Errorf("secret %+v", s)
	}
	pv := PV("pv1", PVSpec{Driver: "drv", Handle: "h"})
	va, err := volumeAttachmentFor(pv, "n1")
	if err != nil || va.Name != attachmentName("h", "drv", "n1") || *va.Spec.Source.PersistentVolumeName != "pv1" || va.Spec.Attacher != "drv" || va.Spec.NodeName != "n1" {
		t.Errorf("VolumeAttachmentFor = %+v, %v", va, err)
	}
	if _, err := volumeAttachmentFor(&v1.PersistentVolume{}, "n1"); err == nil {
		t.Error("VolumeAttachmentFor accepted a PV without a CSI source")
	}

	// Everything goes into a fake clientset as is.
	pvc, bpv := BoundClaim("ns", "c", PVSpec{Driver: "drv", Handle: "h2"})
	objs := []runtime.Object{pv, pvc, bpv, d, Pod("ns", "p", PodSpec{Volumes: []PodVolume{
		{Name: "v", Claim: "c"},
	}}), Secret("ns", "s", nil), va}
	if client := fake.NewClientset(objs...); client == nil {
		t.Fatal("no client")
	}
}
