package csitest

import (
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// setVolumeDefaults fills in what the API server's defaulting of a pod
// (v1.37) fills in a volume it stores, so that a volume built in Go is the
// one a node sees: a volume with no source becomes an emptyDir;
// configMap, secret, downwardAPI and projected volumes get defaultMode
// 0644; a projected serviceAccountToken source expirationSeconds 3600; a
// downward API fieldRef apiVersion "v1" (in a downwardAPI volume and a
// projected source); a hostPath type "" (HostPathUnset); an image volume
// its pull policy (Always for a :latest or untagged reference, else
// IfNotPresent); a generic ephemeral volume's claim template volumeMode
// Filesystem and its resource quantities rounded up to milli-units; the
// kinds nodevol does not mount their defaults too (iscsi, rbd, azureDisk,
// scaleIO). What is set already stays. Pod calls it on every volume.
func setVolumeDefaults(v *v1.Volume) {
	s := &v.VolumeSource
	if *s == (v1.VolumeSource{}) {
		s.EmptyDir = &v1.EmptyDirVolumeSource{}
	}
	if s.Image != nil && s.Image.PullPolicy == "" {
		s.Image.PullPolicy = imagePullPolicy(s.Image.Reference)
	}
	if s.HostPath != nil && s.HostPath.Type == nil {
		s.HostPath.Type = ptr(v1.HostPathUnset)
	}
	if s.Secret != nil {
		defaultMode(&s.Secret.DefaultMode, v1.SecretVolumeSourceDefaultMode)
	}
	if s.ConfigMap != nil {
		defaultMode(&s.ConfigMap.DefaultMode, v1.ConfigMapVolumeSourceDefaultMode)
	}
	if s.DownwardAPI != nil {
		defaultMode(&s.DownwardAPI.DefaultMode, v1.DownwardAPIVolumeSourceDefaultMode)
		defaultFieldRefs(s.DownwardAPI.Items)
	}
	if s.Projected != nil {
		defaultMode(&s.Projected.DefaultMode, v1.ProjectedVolumeSourceDefaultMode)
		for i := range s.Projected.Sources {
			src := &s.Projected.Sources[i]
			if src.DownwardAPI != nil {
				defaultFieldRefs(src.DownwardAPI.Items)
			}
			if t := src.ServiceAccountToken; t != nil && t.ExpirationSeconds == nil {
				t.ExpirationSeconds = ptr(int64(3600))
			}
		}
	}
	if e := s.Ephemeral; e != nil && e.VolumeClaimTemplate != nil {
		spec := &e.VolumeClaimTemplate.Spec
		if spec.VolumeMode == nil {
			spec.VolumeMode = ptr(v1.PersistentVolumeFilesystem)
		}
		roundUpMilli(spec.Resources.Limits)
		roundUpMilli(spec.Resources.Requests)
	}
	setOtherDefaults(s)
}

// setOtherDefaults fills in the defaults of the kinds nodevol does not mount.
func setOtherDefaults(s *v1.VolumeSource) {
	if s.ISCSI != nil && s.ISCSI.ISCSIInterface == "" {
		s.ISCSI.ISCSIInterface = "default"
	}
	if r := s.RBD; r != nil {
		setIfEmpty(&r.RBDPool, "rbd")
		setIfEmpty(&r.RadosUser, "admin")
		setIfEmpty(&r.Keyring, "/etc/ceph/keyring")
	}
	if d := s.AzureDisk; d != nil {
		if d.CachingMode == nil {
			d.CachingMode = ptr(v1.AzureDataDiskCachingReadWrite)
		}
		if d.FSType == nil {
			d.FSType = ptr("ext4")
		}
		if d.ReadOnly == nil {
			d.ReadOnly = ptr(false)
		}
		if d.Kind == nil {
			d.Kind = ptr(v1.AzureSharedBlobDisk)
		}
	}
	if sc := s.ScaleIO; sc != nil {
		setIfEmpty(&sc.StorageMode, "ThinProvisioned")
		setIfEmpty(&sc.FSType, "xfs")
	}
}

func defaultMode(m **int32, def int32) {
	if *m == nil {
		*m = ptr(def)
	}
}

func defaultFieldRefs(items []v1.DownwardAPIVolumeFile) {
	for i := range items {
		if f := items[i].FieldRef; f != nil && f.APIVersion == "" {
			f.APIVersion = "v1"
		}
	}
}

func setIfEmpty(s *string, def string) {
	if *s == "" {
		*s = def
	}
}

// roundUpMilli rounds each quantity up to milli-units, as the API server
// stores them.
func roundUpMilli(l v1.ResourceList) {
	for k, q := range l {
		q.RoundUp(resource.Milli)
		l[k] = q
	}
}

// imagePullPolicy is the API server's default pull policy of an image
// volume: Always for a reference tagged latest, or with neither a tag nor
// a digest (which means latest); else IfNotPresent.
func imagePullPolicy(ref string) v1.PullPolicy {
	name, digest, _ := strings.Cut(ref, "@")
	name = name[strings.LastIndex(name, "/")+1:]
	_, tag, _ := strings.Cut(name, ":")
	if tag == "latest" || tag == "" && digest == "" {
		return v1.PullAlways
	}
	return v1.PullIfNotPresent
}
