package volumemanager

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/objectcache"
)

// envPod is a pod whose containers read configMap "settings" (env
// valueFrom, in the init container), secret "creds" (envFrom) and pull
// secret "registry", and whose volume reads configMap "files".
func envPod(name string) *v1.Pod {
	p := csitest.Pod("ns", name, csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "files", Source: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{
		LocalObjectReference: v1.LocalObjectReference{Name: "files"}}}}}})
	p.Spec.InitContainers = []v1.Container{{Name: "init", Env: []v1.EnvVar{{Name: "MODE", ValueFrom: &v1.EnvVarSource{
		ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "settings"}, Key: "mode"}}}}}}
	p.Spec.Containers[0].EnvFrom = []v1.EnvFromSource{{SecretRef: &v1.SecretEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "creds"}}}}
	p.Spec.Containers[0].VolumeMounts = []v1.VolumeMount{{Name: "files", MountPath: "/etc/files"}}
	p.Spec.ImagePullSecrets = []v1.LocalObjectReference{{Name: "registry"}}
	return p
}

// resolveEnv resolves pod's first regular container's envFrom secrets
// and its init container's configMapKeyRefs, as an agent does before it
// starts them.
func resolveEnv(ctx context.Context, objs *Objects, pod *v1.Pod) (map[string]string, error) {
	env := map[string]string{}
	for _, f := range pod.Spec.Containers[0].EnvFrom {
		s, err := objs.Secret(ctx, pod.Namespace, f.SecretRef.Name)
		if err != nil {
			return nil, err
		}
		for k, v := range s.Data {
			env[k] = string(v)
		}
	}
	for _, e := range pod.Spec.InitContainers[0].Env {
		ref := e.ValueFrom.ConfigMapKeyRef
		cm, err := objs.ConfigMap(ctx, pod.Namespace, ref.Name)
		if err != nil {
			return nil, err
		}
		env[e.Name] = cm.Data[ref.Key]
	}
	return env, nil
}

// TestObjectsResolveEnv: an agent resolves a pod's env from its
// configMap and secret through Objects as soon as AddPod has returned, and
// sees a change of the configMap; a copy it changes is its own. What the
// containers read is held under its own holder, beside the pod's volume
// objects, and let go with the pod.
func TestObjectsResolveEnv(t *testing.T) {
	e := newEnv(t, envOptions{noRegister: true})
	ctx := t.Context()
	settings := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "settings"}, Data: map[string]string{"mode": "fast"}}
	for _, cm := range []*v1.ConfigMap{settings, {ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "files"}}} {
		if _, err := e.client.CoreV1().ConfigMaps("ns").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e.create(&v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "creds"}, Data: map[string][]byte{"TOKEN": []byte("s3cret")}})
	pod := envPod("p")
	if err := e.vm.AddPod(pod); err != nil {
		t.Fatal(err)
	}
	objs := e.vm.Objects()
	readCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	env, err := resolveEnv(readCtx, objs, pod)
	if err != nil {
		t.Fatalf("resolving the env right after AddPod: %v", err)
	}
	if env["MODE"] != "fast" || env["TOKEN"] != "s3cret" {
		t.Fatalf("env %v, want MODE=fast TOKEN=s3cret", env)
	}
	mine, err := objs.ConfigMap(readCtx, "ns", "settings")
	if err != nil {
		t.Fatal(err)
	}
	mine.Data["mode"] = "mine" // the caller's copy, not the cache's
	if again, err := objs.ConfigMap(readCtx, "ns", "settings"); err != nil || again.Data["mode"] != "fast" {
		t.Fatalf("read after the caller changed its copy: %v, %v; want mode fast", again, err)
	}

	settings.Data["mode"] = "slow"
	if _, err := e.client.CoreV1().ConfigMaps("ns").Update(ctx, settings, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the update read", func() bool {
		env, err := resolveEnv(readCtx, objs, pod)
		return err == nil && env["MODE"] == "slow"
	})

	uid := string(pod.UID)
	holders := map[objectcache.Ref][]string{
		{Kind: objectcache.ConfigMap, Namespace: "ns", Name: "settings"}: {containersHolder(pod.UID)},
		{Kind: objectcache.Secret, Namespace: "ns", Name: "creds"}:       {containersHolder(pod.UID)},
		{Kind: objectcache.Secret, Namespace: "ns", Name: "registry"}:    {containersHolder(pod.UID)},
		{Kind: objectcache.ConfigMap, Namespace: "ns", Name: "files"}:    {uid},
	}
	eventually(t, "the volume's configMap held by the pod", func() bool {
		return slices.Equal(e.vm.objects.Holders(objectcache.Ref{Kind: objectcache.ConfigMap, Namespace: "ns", Name: "files"}), []string{uid})
	})
	for r, want := range holders {
		if got := e.vm.objects.Holders(r); !slices.Equal(got, want) {
			t.Errorf("%s held by %v, want %v", r, got, want)
		}
	}
	if _, err := objs.Secret(readCtx, "ns", "registry"); err == nil {
		t.Error("a missing pull secret read without error")
	}

	e.vm.DeletePod(pod)
	for r := range holders {
		eventually(t, r.String()+" let go with the pod", func() bool { return e.vm.objects.Holders(r) == nil })
	}
	if _, err := objs.ConfigMap(readCtx, "ns", "settings"); !errors.Is(err, ErrObjectNotHeld) {
		t.Errorf("reading a configMap no pod references: %v, want ErrObjectNotHeld", err)
	}
}

// TestObjectsEnvReadByCaller: with Config.EnvReadByCaller, AddPod holds
// nothing for the containers (the caller's own managers read them); the
// volume's configMap is held as ever.
func TestObjectsEnvReadByCaller(t *testing.T) {
	e := newEnv(t, envOptions{noRegister: true, envReadByCaller: true})
	pod := envPod("p")
	if err := e.vm.AddPod(pod); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the volume's configMap held", func() bool {
		return e.vm.objects.Holders(objectcache.Ref{Kind: objectcache.ConfigMap, Namespace: "ns", Name: "files"}) != nil
	})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := e.vm.Objects().ConfigMap(ctx, "ns", "settings"); !errors.Is(err, ErrObjectNotHeld) {
		t.Errorf("reading an env configMap: %v, want ErrObjectNotHeld", err)
	}
}

// TestAddPodAfterGoneKeepsContainerObjects: a pod added again after its
// delete was taken in, but before the loop let its objects go, keeps what
// its containers read: the release of the pod gone is ordered with the
// hold of the pod added (inbox.ifGone).
func TestAddPodAfterGoneKeepsContainerObjects(t *testing.T) {
	vm, err := New(Config{NodeName: node, KubeClient: restrictedClient(), RootDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	pod := envPod("p")
	settings := objectcache.Ref{Kind: objectcache.ConfigMap, Namespace: "ns", Name: "settings"}
	vm.DeletePod(pod)
	if err := vm.AddPod(pod); err != nil { // after the loop took the delete
		t.Fatal(err)
	}
	vm.podGone(pod.UID) // the loop acts on the delete it took
	if got := vm.objects.Holders(settings); !slices.Equal(got, []string{containersHolder(pod.UID)}) {
		t.Errorf("%s held by %v after the pod was added again, want its containers", settings, got)
	}
	vm.DeletePod(pod)
	vm.podGone(pod.UID)
	if got := vm.objects.Holders(settings); got != nil {
		t.Errorf("%s held by %v after the pod went, want none", settings, got)
	}
}

// TestContainerObjects: the configMaps and secrets of every kind of
// container's env and envFrom, and the pull secrets, in the pod's
// namespace; nothing for an env var of another source or an empty name.
func TestContainerObjects(t *testing.T) {
	cmKey := func(name string) *v1.EnvVarSource {
		return &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: name}, Key: "k"}}
	}
	secretKey := func(name string) *v1.EnvVarSource {
		return &v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: name}, Key: "k"}}
	}
	cm := func(name string) objectcache.Ref {
		return objectcache.Ref{Kind: objectcache.ConfigMap, Namespace: "ns", Name: name}
	}
	sec := func(name string) objectcache.Ref {
		return objectcache.Ref{Kind: objectcache.Secret, Namespace: "ns", Name: name}
	}
	for _, tc := range []struct {
		name string
		spec v1.PodSpec
		want []objectcache.Ref
	}{
		{"none", v1.PodSpec{Containers: []v1.Container{{Name: "c", Env: []v1.EnvVar{{Name: "A", Value: "a"},
			{Name: "B", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}}}}, nil},
		{"env of each kind of container", v1.PodSpec{
			InitContainers: []v1.Container{{Name: "i", Env: []v1.EnvVar{{Name: "A", ValueFrom: cmKey("init-cm")}}}},
			Containers:     []v1.Container{{Name: "c", Env: []v1.EnvVar{{Name: "B", ValueFrom: secretKey("app-secret")}}}},
			EphemeralContainers: []v1.EphemeralContainer{{EphemeralContainerCommon: v1.EphemeralContainerCommon{Name: "e",
				Env: []v1.EnvVar{{Name: "C", ValueFrom: cmKey("debug-cm")}}}}},
		}, []objectcache.Ref{cm("init-cm"), sec("app-secret"), cm("debug-cm")}},
		{"envFrom and pull secrets", v1.PodSpec{
			Containers: []v1.Container{{Name: "c", EnvFrom: []v1.EnvFromSource{
				{ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "all-cm"}}},
				{SecretRef: &v1.SecretEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "all-secret"}}},
				{ConfigMapRef: &v1.ConfigMapEnvSource{}},
			}}},
			ImagePullSecrets: []v1.LocalObjectReference{{Name: "pull"}, {}},
		}, []objectcache.Ref{cm("all-cm"), sec("all-secret"), sec("pull")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}, Spec: tc.spec}
			if got := containerObjects(pod); !slices.Equal(got, tc.want) {
				t.Errorf("containerObjects = %v, want %v", got, tc.want)
			}
		})
	}
}
