package csitest

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/dump"
)

// TestVolumeDefaults: each kind gets what the API server v1.37's
// defaulting of a pod gives it (k8s.io/kubernetes pkg/apis/core/v1
// defaults.go and zz_generated.defaults.go), and what is set stays.
func TestVolumeDefaults(t *testing.T) {
	mode := func(m int32) *int32 { return &m }
	fs := v1.PersistentVolumeFilesystem
	block := v1.PersistentVolumeBlock
	tests := []struct {
		name     string
		in, want v1.VolumeSource
	}{
		{"no source: an emptyDir", v1.VolumeSource{}, v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
		{"emptyDir: medium left empty",
			v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}, v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
		{"hostPath: type unset",
			v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/x"}},
			v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/x", Type: ptr(v1.HostPathUnset)}}},
		{"hostPath: type kept",
			v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/x", Type: ptr(v1.HostPathDirectory)}},
			v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/x", Type: ptr(v1.HostPathDirectory)}}},
		{"claim: readOnly stays false",
			v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}},
			v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}}},
		{"configMap: 0644",
			v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{}}, v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{DefaultMode: mode(0o644)}}},
		{"configMap: mode kept",
			v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{DefaultMode: mode(0o400)}}, v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{DefaultMode: mode(0o400)}}},
		{"secret: 0644",
			v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "s"}}, v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "s", DefaultMode: mode(0o644)}}},
		{"downwardAPI: 0644 and fieldRef apiVersion",
			v1.VolumeSource{DownwardAPI: &v1.DownwardAPIVolumeSource{Items: []v1.DownwardAPIVolumeFile{
				{Path: "n", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}},
				{Path: "l", FieldRef: &v1.ObjectFieldSelector{APIVersion: "v2", FieldPath: "metadata.labels"}},
				{Path: "m", ResourceFieldRef: &v1.ResourceFieldSelector{Resource: "limits.memory"}}}}},
			v1.VolumeSource{DownwardAPI: &v1.DownwardAPIVolumeSource{DefaultMode: mode(0o644), Items: []v1.DownwardAPIVolumeFile{
				{Path: "n", FieldRef: &v1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}},
				{Path: "l", FieldRef: &v1.ObjectFieldSelector{APIVersion: "v2", FieldPath: "metadata.labels"}},
				{Path: "m", ResourceFieldRef: &v1.ResourceFieldSelector{Resource: "limits.memory"}}}}}},
		{"projected: 0644, token 3600 s, fieldRef apiVersion",
			v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{
				{ServiceAccountToken: &v1.ServiceAccountTokenProjection{Path: "token"}},
				{ServiceAccountToken: &v1.ServiceAccountTokenProjection{Path: "t2", ExpirationSeconds: ptr(int64(7200))}},
				{ConfigMap: &v1.ConfigMapProjection{LocalObjectReference: v1.LocalObjectReference{Name: "kube-root-ca.crt"}}},
				{DownwardAPI: &v1.DownwardAPIProjection{Items: []v1.DownwardAPIVolumeFile{{Path: "ns", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}}}}}}},
			v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{DefaultMode: mode(0o644), Sources: []v1.VolumeProjection{
				{ServiceAccountToken: &v1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr(int64(3600))}},
				{ServiceAccountToken: &v1.ServiceAccountTokenProjection{Path: "t2", ExpirationSeconds: ptr(int64(7200))}},
				{ConfigMap: &v1.ConfigMapProjection{LocalObjectReference: v1.LocalObjectReference{Name: "kube-root-ca.crt"}}},
				{DownwardAPI: &v1.DownwardAPIProjection{Items: []v1.DownwardAPIVolumeFile{{Path: "ns", FieldRef: &v1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}}}}}},
		{"image: untagged is latest",
			v1.VolumeSource{Image: &v1.ImageVolumeSource{Reference: "registry:5000/img"}},
			v1.VolumeSource{Image: &v1.ImageVolumeSource{Reference: "registry:5000/img", PullPolicy: v1.PullAlways}}},
		{"image: :latest",
			v1.VolumeSource{Image: &v1.ImageVolumeSource{Reference: "img:latest@sha256:0123"}},
			v1.VolumeSource{Image: &v1.ImageVolumeSource{Reference: "img:latest@sha256:0123", PullPolicy: v1.PullAlways}}},
		{"image: tagged",
			v1.VolumeSource{Image: &v1.ImageVolumeSource{Reference: "registry:5000/img:1.0"}},
			v1.VolumeSource{Image: &v1.ImageVolumeSource{Reference: "registry:5000/img:1.0", PullPolicy: v1.PullIfNotPresent}}},
		{"image: by digest",
			v1.VolumeSource{Image: &v1.ImageVolumeSource{Reference: "img@sha256:0123"}},
			v1.VolumeSource{Image: &v1.ImageVolumeSource{Reference: "img@sha256:0123", PullPolicy: v1.PullIfNotPresent}}},
		{"image: policy kept",
			v1.VolumeSource{Image: &v1.ImageVolumeSource{Reference: "img", PullPolicy: v1.PullNever}},
			v1.VolumeSource{Image: &v1.ImageVolumeSource{Reference: "img", PullPolicy: v1.PullNever}}},
		{"ephemeral: Filesystem, quantities rounded up to milli-units",
			v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{VolumeClaimTemplate: &v1.PersistentVolumeClaimTemplate{Spec: v1.PersistentVolumeClaimSpec{
				Resources: v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse("1.0001m")}}}}}},
			v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{VolumeClaimTemplate: &v1.PersistentVolumeClaimTemplate{Spec: v1.PersistentVolumeClaimSpec{
				VolumeMode: &fs, Resources: v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse("2m")}}}}}}},
		{"ephemeral: mode kept",
			v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{VolumeClaimTemplate: &v1.PersistentVolumeClaimTemplate{Spec: v1.PersistentVolumeClaimSpec{VolumeMode: &block}}}},
			v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{VolumeClaimTemplate: &v1.PersistentVolumeClaimTemplate{Spec: v1.PersistentVolumeClaimSpec{VolumeMode: &block}}}}},
		{"csi: nothing defaulted",
			v1.VolumeSource{CSI: &v1.CSIVolumeSource{Driver: "d"}}, v1.VolumeSource{CSI: &v1.CSIVolumeSource{Driver: "d"}}},
		{"iscsi", v1.VolumeSource{ISCSI: &v1.ISCSIVolumeSource{}}, v1.VolumeSource{ISCSI: &v1.ISCSIVolumeSource{ISCSIInterface: "default"}}},
		{"rbd", v1.VolumeSource{RBD: &v1.RBDVolumeSource{}}, v1.VolumeSource{RBD: &v1.RBDVolumeSource{RBDPool: "rbd", RadosUser: "admin", Keyring: "/etc/ceph/keyring"}}},
		{"azureDisk", v1.VolumeSource{AzureDisk: &v1.AzureDiskVolumeSource{}}, v1.VolumeSource{AzureDisk: &v1.AzureDiskVolumeSource{
			CachingMode: ptr(v1.AzureDataDiskCachingReadWrite), FSType: ptr("ext4"), ReadOnly: ptr(false), Kind: ptr(v1.AzureSharedBlobDisk)}}},
		{"scaleIO", v1.VolumeSource{ScaleIO: &v1.ScaleIOVolumeSource{}}, v1.VolumeSource{ScaleIO: &v1.ScaleIOVolumeSource{StorageMode: "ThinProvisioned", FSType: "xfs"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := v1.Volume{Name: "v", VolumeSource: *tt.in.DeepCopy()}
			setVolumeDefaults(&v)
			if !equality.Semantic.DeepEqual(v.VolumeSource, tt.want) {
				t.Errorf("got\n%s\nwant\n%s", dump.Pretty(v.VolumeSource), dump.Pretty(tt.want))
			}
			// The pod builders default every volume they add.
			in := tt.in.DeepCopy()
			pod := Pod("ns", "p", PodSpec{Volumes: []PodVolume{{Name: "v", Source: *in}}})
			if !equality.Semantic.DeepEqual(pod.Spec.Volumes[0].VolumeSource, tt.want) {
				t.Errorf("Pod's volume:\n%s\nwant\n%s", dump.Pretty(pod.Spec.Volumes[0].VolumeSource), dump.Pretty(tt.want))
			}
			if !equality.Semantic.DeepEqual(*in, tt.in) {
				t.Errorf("Pod changed the volume it was given: %s", dump.Pretty(*in))
			}
		})
	}
}
