package flexvolume

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"

	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/podvol"
)

// The keys of the JSON options, the kubelet's.
const (
	optFSType          = "kubernetes.io/fsType"
	optReadWrite       = "kubernetes.io/readwrite"
	optSecret          = "kubernetes.io/secret"
	optFSGroup         = "kubernetes.io/mounterArgs.FsGroup"
	optPVOrVolumeName  = "kubernetes.io/pvOrVolumeName"
	optPodName         = "kubernetes.io/pod.name"
	optPodNamespace    = "kubernetes.io/pod.namespace"
	optPodUID          = "kubernetes.io/pod.uid"
	optServiceAccount  = "kubernetes.io/serviceAccount.name"
	defaultFSTypeMount = "auto"
)

// source is what a volume's spec says of its flexVolume: the pod volume's
// or the PV's source, and the name the driver is told (the PV's, or the
// pod volume's).
type source struct {
	driver   string
	fsType   string
	readOnly bool
	options  map[string]string
	// secretName and secretNamespace name the secretRef ("" none); an
	// inline volume's is in the pod's namespace, as a PV's without one.
	secretName, secretNamespace string
	// name is the PV's name, or the pod volume's.
	name string
}

// Objects implements volume.ObjectReader for every flexVolume pod
// volume, whether or not its driver is there yet: the Secret its
// secretRef names, in the pod's namespace, which the volume manager holds
// in its object cache for Secrets to read.
func (ds *Drivers) Objects(namespace string, v *v1.Volume) []objectcache.Ref {
	f := v.FlexVolume
	if f == nil || f.SecretRef == nil || f.SecretRef.Name == "" {
		return nil
	}
	return []objectcache.Ref{{Kind: objectcache.Secret, Namespace: namespace, Name: f.SecretRef.Name}}
}

// sourceOf returns the flexVolume of spec; name is the pod volume's name
// for an inline volume. readOnly is the pod's use of a PV (its claim's
// readOnly, which the kubelet passes for a PV) or the inline source's.
func sourceOf(spec *podvol.VolumeSpec, podVolumeName string, podReadOnly bool) (source, error) {
	switch {
	case spec.Source != nil && spec.Source.FlexVolume != nil:
		f := spec.Source.FlexVolume
		s := source{driver: f.Driver, fsType: f.FSType, readOnly: f.ReadOnly, options: f.Options, name: podVolumeName}
		if f.SecretRef != nil {
			s.secretName = f.SecretRef.Name
		}
		return s, nil
	case spec.PVSource != nil && spec.PVSource.FlexVolume != nil:
		f := spec.PVSource.FlexVolume
		s := source{driver: f.Driver, fsType: f.FSType, readOnly: podReadOnly, options: f.Options, name: spec.PVName}
		if f.SecretRef != nil {
			s.secretName, s.secretNamespace = f.SecretRef.Name, f.SecretRef.Namespace
		}
		return s, nil
	}
	return source{}, fmt.Errorf("volume %s has no flexVolume source", spec.Name)
}

// json is the JSON options of a call: the kubelet's common ones,
// then extra, then the source's own options (which win, as in the
// kubelet).
func (s source) json(extra map[string]string) (string, error) {
	o := map[string]string{optFSType: s.fsType, optReadWrite: "rw", optPVOrVolumeName: s.name}
	if s.readOnly {
		o[optReadWrite] = "ro"
	}
	for k, v := range extra {
		o[k] = v
	}
	for k, v := range s.options {
		o[k] = v
	}
	b, err := json.Marshal(o)
	if err != nil {
		return "", fmt.Errorf("failed to marshal spec, error: %w", err)
	}
	return string(b), nil
}

// mountOptions are the extra options of a mount call: the pod, its
// fsGroup and the secret's keys.
func (d *driver) mountOptions(ctx context.Context, s source, vol podvol.PodVolume) (map[string]string, error) {
	extra := map[string]string{
		optPodName:        vol.Pod.Name,
		optPodNamespace:   vol.Pod.Namespace,
		optPodUID:         string(vol.Pod.UID),
		optServiceAccount: vol.Pod.ServiceAccount,
	}
	if vol.FSGroup != nil {
		extra[optFSGroup] = strconv.FormatInt(*vol.FSGroup, 10)
	}
	if err := d.addSecret(ctx, extra, s, vol.Pod.Namespace); err != nil {
		return nil, err
	}
	return extra, nil
}

// addSecret adds the keys of the volume's secret, base64, as the kubelet
// does: the secret must be of the driver's type. Only the keys are logged.
func (d *driver) addSecret(ctx context.Context, extra map[string]string, s source, podNamespace string) error {
	if s.secretName == "" {
		return nil
	}
	ns := s.secretNamespace
	if ns == "" {
		ns = podNamespace
	}
	if ns == "" {
		return nil
	}
	if d.host.secrets == nil {
		return fmt.Errorf("couldn't get secret %s/%s err: no secret reader configured", ns, s.secretName)
	}
	sec, err := d.host.secrets.Secret(ctx, ns, s.secretName)
	if err == nil && sec.Type != v1.SecretType(d.name) {
		err = fmt.Errorf("cannot get secret of type %s", d.name)
	}
	if err != nil {
		return fmt.Errorf("couldn't get secret %s/%s err: %w", ns, s.secretName, err)
	}
	for k, v := range sec.Data {
		extra[optSecret+"/"+k] = base64.StdEncoding.EncodeToString(v)
	}
	return nil
}
