package volumemanager

import (
	"context"
	"errors"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/internal/objectcache"
)

// ErrObjectNotHeld is wrapped by the error of an Objects read of an object
// that no pod added to the manager references (or that the manager does
// not hold for it: Config.EnvReadByCaller).
var ErrObjectNotHeld = errors.New("no pod added to the volume manager references it")

// Objects reads, from the node's object cache, the configMaps and secrets
// of the pods added to a VolumeManager: what their volumes read, and
// (unless Config.EnvReadByCaller) what their containers read, their env
// (valueFrom configMapKeyRef and secretKeyRef), envFrom and
// imagePullSecrets. An agent resolves its containers' environment from
// it, through the same watches that keep the pods' configMap and secret
// volumes current, with no cache of its own. Safe for concurrent use.
//
// A pod holds the objects its containers reference from its AddPod (the
// hold is made before AddPod returns, as the kubelet registers a pod with
// its configMap and secret managers) until its DeletePod has been taken
// in; what its volumes reference is held once the manager has resolved
// the pod (before WaitForAttachAndMount returns) until then too.
type Objects struct {
	cache *objectcache.Cache
}

// Objects returns the reader of the pods' configMaps and secrets.
func (vm *VolumeManager) Objects() *Objects { return &Objects{cache: vm.objects} }

// ConfigMap returns configMap namespace/name, a copy the caller owns.
//
// Fresh: the cache watches each object it holds (one watch of that object
// by name), so the answer is the API server's within one watch event; an
// immutable configMap is read once. While a watch fails and is retried
// (with backoff), the last object read is answered.
//
// It waits, bounded by ctx, for the first read of an object newly held
// (reads start with Run). Errors: ErrObjectNotHeld (errors.Is) when no
// pod added references it; apierrors.IsNotFound when it does not exist;
// apierrors.IsForbidden when the node may not read it (under the Node
// authorizer: no pod bound to this node references it, as the API server
// sees it); the API server's error while no read has answered with the
// object; ctx's error; and one saying that the manager stopped once Run
// has returned.
func (o *Objects) ConfigMap(ctx context.Context, namespace, name string) (*v1.ConfigMap, error) {
	cm, err := read[*v1.ConfigMap](ctx, o.cache, objectcache.Ref{Kind: objectcache.ConfigMap, Namespace: namespace, Name: name})
	if err != nil {
		return nil, err
	}
	return cm.DeepCopy(), nil
}

// Secret returns secret namespace/name, a copy the caller owns, as
// ConfigMap returns a configMap (same freshness, waits and errors).
func (o *Objects) Secret(ctx context.Context, namespace, name string) (*v1.Secret, error) {
	s, err := read[*v1.Secret](ctx, o.cache, objectcache.Ref{Kind: objectcache.Secret, Namespace: namespace, Name: name})
	if err != nil {
		return nil, err
	}
	return s.DeepCopy(), nil
}

// read gets r from the cache as type T, turning the cache's not held into
// ErrObjectNotHeld.
func read[T any](ctx context.Context, c *objectcache.Cache, r objectcache.Ref) (T, error) {
	var zero T
	o, err := c.Get(ctx, r)
	switch {
	case errors.Is(err, objectcache.ErrNotHeld):
		return zero, fmt.Errorf("reading %s: %w", r, ErrObjectNotHeld)
	case err != nil:
		return zero, err // names r
	}
	t, ok := o.(T)
	if !ok {
		return zero, fmt.Errorf("reading %s: the cache holds a %T", r, o)
	}
	return t, nil
}

// containerObjects returns the configMaps and secrets a pod's containers
// read (env valueFrom, envFrom, of init, regular and ephemeral containers)
// and its imagePullSecrets: what the kubelet's configMap and secret
// managers register for a pod beside its volumes' (resolve.PodObjects).
func containerObjects(pod *v1.Pod) []objectcache.Ref {
	var out []objectcache.Ref
	add := func(kind objectcache.Kind, name string) {
		if name != "" {
			out = append(out, objectcache.Ref{Kind: kind, Namespace: pod.Namespace, Name: name})
		}
	}
	env := func(from []v1.EnvFromSource, vars []v1.EnvVar) {
		for _, f := range from {
			if f.ConfigMapRef != nil {
				add(objectcache.ConfigMap, f.ConfigMapRef.Name)
			}
			if f.SecretRef != nil {
				add(objectcache.Secret, f.SecretRef.Name)
			}
		}
		for _, e := range vars {
			switch s := e.ValueFrom; {
			case s == nil:
			case s.ConfigMapKeyRef != nil:
				add(objectcache.ConfigMap, s.ConfigMapKeyRef.Name)
			case s.SecretKeyRef != nil:
				add(objectcache.Secret, s.SecretKeyRef.Name)
			}
		}
	}
	for _, cs := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			env(cs[i].EnvFrom, cs[i].Env)
		}
	}
	for i := range pod.Spec.EphemeralContainers {
		c := &pod.Spec.EphemeralContainers[i]
		env(c.EnvFrom, c.Env)
	}
	for _, s := range pod.Spec.ImagePullSecrets {
		add(objectcache.Secret, s.Name)
	}
	return out
}

// containersHolder is the holder name, in the object cache, of what a
// pod's containers read: not the pod's own (resolve.PodHolder), whose set the
// loop replaces at each resolution, but one AddPod sets at once. It is no
// pod UID (it has a space), so the loop's routing of a change to the
// holders' pods passes it by.
func containersHolder(uid types.UID) string { return "containers " + string(uid) }

// holdContainerObjects makes pod hold what its containers read, unless
// the caller reads them itself.
func (vm *VolumeManager) holdContainerObjects(pod *v1.Pod) {
	if !vm.cfg.EnvReadByCaller {
		vm.objects.Hold(containersHolder(pod.UID), containerObjects(pod)...)
	}
}
