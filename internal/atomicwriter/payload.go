package atomicwriter

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	v1 "k8s.io/api/core/v1"
)

// File is one file of a payload: the kubelet's FileProjection.
type File struct {
	// Data is the file's content.
	Data []byte
	// Mode is the file's permission bits (0 to 0777; other bits are
	// ignored). The pod's fsGroup, if the writer has one, adds group read.
	Mode int32
	// FSUser, if set, is the file's owner (and its user-visible link's),
	// the kubelet's FsUser. Unset: the writer's own user.
	FSUser *int64
}

// errNoDefaultMode is the kubelet's error for a source whose defaultMode
// the API server did not default.
var errNoDefaultMode = errors.New("no defaultMode used, not even the default value for it")

// Items says how the keys of a configMap or a secret become files: the
// fields of a ConfigMapVolumeSource, a SecretVolumeSource or a projected
// volume's configMap or secret source (with the projected volume's
// defaultMode and defaultUser).
type Items struct {
	// Items maps keys to paths (and modes, users). Empty: every key is a
	// file named after it.
	Items []v1.KeyToPath
	// DefaultMode is the mode of a file whose item has none. Required (the
	// API server defaults it): nil is the kubelet's error.
	DefaultMode *int32
	// DefaultUser is the owner of a file whose item has none, with
	// UserFields.
	DefaultUser *int64
	// Optional: a key of Items missing from the object is skipped rather
	// than an error (a missing object is the caller's: it passes nil).
	Optional bool
	// UserFields turns on the user fields (defaultUser, items[].user) of
	// the AtomicWriteVolumeUserFields feature (alpha in 1.37, off by
	// default): without it they are ignored, as the kubelet ignores them.
	UserFields bool
}

// ConfigMapPayload returns the files of configMap cm (nil: a missing
// optional configMap, with no keys) as it, with Data and BinaryData, the
// kubelet's configmap.MakePayload, and its error texts.
func ConfigMapPayload(cm *v1.ConfigMap, it Items) (map[string]File, error) {
	keys := map[string][]byte{}
	if cm != nil {
		for k, v := range cm.Data {
			keys[k] = []byte(v)
		}
		// A key in both is refused by the API server; BinaryData wins here
		// as it does in the kubelet, which writes it last.
		maps.Copy(keys, cm.BinaryData)
	}
	return makePayload(keys, it, func(key string) error {
		return fmt.Errorf("configmap references non-existent config key: %s", key)
	})
}

// SecretPayload is ConfigMapPayload for secret s (nil: a missing optional
// secret), the kubelet's secret.MakePayload.
func SecretPayload(s *v1.Secret, it Items) (map[string]File, error) {
	var keys map[string][]byte
	if s != nil {
		keys = s.Data
	}
	return makePayload(keys, it, func(key string) error {
		return fmt.Errorf("references non-existent secret key: %s", key)
	})
}

func makePayload(keys map[string][]byte, it Items, missing func(key string) error) (map[string]File, error) {
	if it.DefaultMode == nil {
		return nil, errNoDefaultMode
	}
	if len(it.Items) == 0 {
		payload := make(map[string]File, len(keys))
		var user *int64
		if it.UserFields {
			user = it.DefaultUser
		}
		for _, k := range slices.Sorted(maps.Keys(keys)) {
			payload[k] = File{Data: keys[k], Mode: *it.DefaultMode, FSUser: user}
		}
		return payload, nil
	}
	payload := make(map[string]File, len(it.Items))
	for _, item := range it.Items {
		data, ok := keys[item.Key]
		if !ok {
			if it.Optional {
				continue
			}
			return nil, missing(item.Key)
		}
		f := File{Data: data, Mode: *it.DefaultMode, FSUser: FileUser(it.UserFields, nil, it.DefaultUser, item.User)}
		if item.Mode != nil {
			f.Mode = *item.Mode
		}
		payload[item.Path] = f
	}
	return payload, nil
}

// FileUser returns the owner of one file of a payload, the kubelet's
// rule: podUser (the projected plugin's FsUser of the pod: the one
// runAsUser all its containers share; nil for the other plugins) unless
// userFields is on, in which case the item's user wins, then the source's
// defaultUser, then podUser.
func FileUser(userFields bool, podUser, defaultUser, itemUser *int64) *int64 {
	if !userFields {
		return podUser
	}
	if itemUser != nil {
		return itemUser
	}
	if defaultUser != nil {
		return defaultUser
	}
	return podUser
}

// ProjectedMode is the mode of a projected volume's serviceAccountToken,
// clusterTrustBundle or podCertificate file, the kubelet's rule:
// defaultMode, or 0600 when the file has an owner or the pod an fsGroup
// (which then adds group read: 0640).
func ProjectedMode(defaultMode int32, fsUser, fsGroup *int64) int32 {
	if fsUser != nil || fsGroup != nil {
		return 0o600
	}
	return defaultMode
}

// FSUser is the owner the kubelet gives a projected volume's token, trust
// bundle and certificate files (its FsUserFrom): the runAsUser that every
// container of pod (init, regular and ephemeral) runs as, its own or the
// pod's; nil when one has none or two differ. The projected plugin's
// ResolveSpec stores it (FileUser's podUser); the volume manager must keep
// what it reads of a pod it trims (the pod's and every container's
// runAsUser).
func FSUser(pod *v1.Pod) *int64 {
	var podUser *int64
	if sc := pod.Spec.SecurityContext; sc != nil {
		podUser = sc.RunAsUser
	}
	var users []*v1.SecurityContext
	for i := range pod.Spec.InitContainers {
		users = append(users, pod.Spec.InitContainers[i].SecurityContext)
	}
	for i := range pod.Spec.Containers {
		users = append(users, pod.Spec.Containers[i].SecurityContext)
	}
	for i := range pod.Spec.EphemeralContainers {
		users = append(users, pod.Spec.EphemeralContainers[i].SecurityContext)
	}
	var out *int64
	for _, sc := range users {
		u := podUser
		if sc != nil && sc.RunAsUser != nil {
			u = sc.RunAsUser
		}
		if u == nil || (out != nil && *out != *u) {
			return nil
		}
		out = u
	}
	if out == nil {
		return nil
	}
	v := *out
	return &v
}
