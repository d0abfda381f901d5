package adapter

import (
	"context"
	"errors"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/kubernetes/pkg/kubelet/configmap"
	"k8s.io/kubernetes/pkg/kubelet/secret"

	nvm "github.com/nodevol/nodevol/volumemanager"
)

// firstReadWait bounds how long a read waits for an object's first answer
// from the API server: the second the kubelet's watching managers wait for
// their reflector to sync before they fail the read (the pod worker tries
// again at its next sync).
const firstReadWait = time.Second

// ObjectManagers returns the configMap and secret managers the kubelet
// reads its containers' env, envFrom and image pull secrets from, in place
// of its own (the kubelet's hook, patches/0001): both read nodevol's object
// cache, where each pod holds what its containers read from its AddPod
// (nodevol's Config.EnvReadByCaller is false), so an object a pod reads
// both as a volume and as env is watched once on the node, not once by
// nodevol and once more by the kubelet's managers.
//
// RegisterPod and UnregisterPod do nothing: nodevol holds a pod's objects
// from its AddPod, which WaitForAttachAndMount makes before the kubelet
// starts a container, until the pod is deleted from nodevol, once its
// containers are gone.
func (m *Manager) ObjectManagers() (secret.Manager, configmap.Manager) {
	o := m.vm.Objects()
	return secretReader{o}, configMapReader{o}
}

type secretReader struct{ o *nvm.Objects }

func (r secretReader) GetSecret(namespace, name string) (*v1.Secret, error) {
	ctx, cancel := context.WithTimeout(context.Background(), firstReadWait)
	defer cancel()
	s, err := r.o.Secret(ctx, namespace, name)
	return s, kubeletObjectError(v1.Resource("secret"), namespace, name, err)
}

func (secretReader) RegisterPod(*v1.Pod)   {}
func (secretReader) UnregisterPod(*v1.Pod) {}

type configMapReader struct{ o *nvm.Objects }

func (r configMapReader) GetConfigMap(namespace, name string) (*v1.ConfigMap, error) {
	ctx, cancel := context.WithTimeout(context.Background(), firstReadWait)
	defer cancel()
	cm, err := r.o.ConfigMap(ctx, namespace, name)
	return cm, kubeletObjectError(v1.Resource("configmap"), namespace, name, err)
}

func (configMapReader) RegisterPod(*v1.Pod)   {}
func (configMapReader) UnregisterPod(*v1.Pod) {}

// kubeletObjectError is err of a read of namespace/name in the words of
// the kubelet's watching managers, which its container start events
// carry ("Error: configmap "x" not found"): an object no pod holds is
// "not registered", a missing one the kubelet's own NotFound (of resource
// "configmap" or "secret"), a first read not answered in time "failed to
// sync". Any other error (forbidden, the API server's) is nodevol's, which
// names the object.
func kubeletObjectError(gr schema.GroupResource, namespace, name string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, nvm.ErrObjectNotHeld):
		return fmt.Errorf("object %q/%q not registered", namespace, name)
	case apierrors.IsNotFound(err):
		return apierrors.NewNotFound(gr, name)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("failed to sync %s cache: %w", gr.String(), err)
	}
	return err
}
