package adapter

import (
	"context"
	"maps"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// TestObjectManagers: the kubelet's containers read their env, envFrom
// and image pull secrets from nodevol's object cache, held once the pod
// is added (by WaitForAttachAndMount at the latest), each object read by one watch on the node (a
// configMap a pod reads as a volume and as env included), with the
// kubelet's managers' errors.
func TestObjectManagers(t *testing.T) {
	cfg := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cfg"}, Data: map[string]string{"k": "v"}}
	sec := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "sec"}, Data: map[string][]byte{"p": []byte("w")}}
	pull := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pull"}}
	pod := csitest.Pod("ns", "web", csitest.PodSpec{Node: node, Volumes: []csitest.PodVolume{
		{Name: "conf", Source: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "cfg"}}}},
	}})
	optional := true
	pod.Spec.Containers[0].Env = []v1.EnvVar{
		{Name: "K", ValueFrom: &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "cfg"}, Key: "k"}}},
		{Name: "G", ValueFrom: &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "gone"}, Key: "k", Optional: &optional}}},
	}
	pod.Spec.Containers[0].EnvFrom = []v1.EnvFromSource{{SecretRef: &v1.SecretEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "sec"}}}}
	pod.Spec.ImagePullSecrets = []v1.LocalObjectReference{{Name: "pull"}}
	client := fakeClient(cfg, sec, pull)
	pods := newKubeletPods(pod)
	m, err := newManager(options{nodeName: node, podManager: pods, podState: pods, client: client,
		mounter: mount.NewFakeMounter(nil), rootDir: t.TempDir(), statsPeriod: time.Minute, mutate: privateRegistry})
	if err != nil {
		t.Fatal(err)
	}
	secrets, configMaps := m.ObjectManagers()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.Run(ctx, config.NewSourcesReady(func(sets.Set[string]) bool { return true }))
	}()
	t.Cleanup(func() { cancel(); <-done })

	configMaps.RegisterPod(pod)
	secrets.RegisterPod(pod)
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	if err := m.WaitForAttachAndMount(wctx, pod); err != nil {
		t.Fatalf("WaitForAttachAndMount: %v", err)
	}

	if got, err := configMaps.GetConfigMap("ns", "cfg"); err != nil || got.Data["k"] != "v" {
		t.Errorf("GetConfigMap(cfg) = %v, %v", got, err)
	}
	for _, name := range []string{"sec", "pull"} {
		if got, err := secrets.GetSecret("ns", name); err != nil || got.Name != name {
			t.Errorf("GetSecret(%s) = %v, %v", name, got, err)
		}
	}
	_, err = configMaps.GetConfigMap("ns", "gone")
	if !apierrors.IsNotFound(err) || err.Error() != `configmap "gone" not found` {
		t.Errorf("GetConfigMap(gone) = %v, want the kubelet's NotFound", err)
	}
	if _, err := secrets.GetSecret("ns", "other"); err == nil || err.Error() != `object "ns"/"other" not registered` {
		t.Errorf("GetSecret(other) = %v, want the kubelet's not registered", err)
	}
	want := map[string]int{"configmaps/cfg": 1, "configmaps/gone": 1, "secrets/sec": 1, "secrets/pull": 1}
	if got := watchesByName(client); !maps.Equal(got, want) {
		t.Errorf("watches opened by name %v, want one per object %v", got, want)
	}
}

// watchesByName counts the watches of configMaps and secrets client was
// asked for, by resource and the name their field selector names.
func watchesByName(client *fake.Clientset) map[string]int {
	got := map[string]int{}
	for _, a := range client.Actions() {
		w, ok := a.(clienttesting.WatchAction)
		if !ok || (w.GetResource().Resource != "configmaps" && w.GetResource().Resource != "secrets") {
			continue
		}
		name, _ := w.GetWatchRestrictions().Fields.RequiresExactMatch("metadata.name")
		got[w.GetResource().Resource+"/"+name]++
	}
	return got
}
