package volumemanager

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	fakeclock "k8s.io/utils/clock/testing"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/configmap"
	"github.com/nodevol/nodevol/volumemanager/internal/reconciler"
)

// configPlugin claims configMap volumes, republishes them (as the kubelet
// remounts them) and writes, as its SetUp, the configMap's data it reads
// from the object podvol.
type configPlugin struct {
	objects *objectcache.Cache
	mu      sync.Mutex
	seen    []string // the data of each SetUp
}

func (p *configPlugin) Name() string                 { return "example.com/config" }
func (p *configPlugin) CanSupport(v *v1.Volume) bool { return v.ConfigMap != nil }
func (p *configPlugin) Capabilities(*podvol.VolumeSpec) (volume.Capabilities, error) {
	return volume.Capabilities{Republish: true}, nil
}
func (p *configPlugin) TearDown(context.Context, volume.MountRequest) error { return nil }
func (p *configPlugin) SetUp(ctx context.Context, req volume.MountRequest) (string, error) {
	ref := objectcache.Ref{Kind: objectcache.ConfigMap, Namespace: req.Volume.Pod.Namespace, Name: req.Spec.Source.ConfigMap.Name}
	obj, err := p.objects.Get(ctx, ref)
	if err != nil {
		return "", err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seen = append(p.seen, obj.(*v1.ConfigMap).Data["k"])
	return "/config", nil
}

func (p *configPlugin) setUps() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.seen)
}

// TestObjectChangeRepublishes: a pod holds the configMaps its volumes read
// in the node's object cache; a change of one reaches the plugin's SetUp
// at once, through the watch, not at the next resync (a minute away);
// the pod's deletion releases it.
func TestObjectChangeRepublishes(t *testing.T) {
	p := &configPlugin{}
	e := newEnv(t, envOptions{plugins: []volume.Plugin{p}})
	p.objects = e.vm.objects
	ctx := context.Background()
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "settings"}, Data: map[string]string{"k": "one"}}
	if _, err := e.client.CoreV1().ConfigMaps("ns").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := csitest.Pod("ns", "web", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "conf", Source: v1.VolumeSource{
		ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "settings"}}}}}})
	if err := e.mount(pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	ref := objectcache.Ref{Kind: objectcache.ConfigMap, Namespace: "ns", Name: "settings"}
	if h := e.vm.objects.Holders(ref); !slices.Equal(h, []string{string(pod.UID)}) {
		t.Fatalf("holders of the configMap = %v, want the pod", h)
	}
	eventually(t, "the object cache watching configMap ns/settings", func() bool { return watching(e.client, "configmaps", "ns", "settings") })
	cm.Data["k"] = "two"
	if _, err := e.client.CoreV1().ConfigMaps("ns").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the new data set up", func() bool { return slices.Contains(p.setUps(), "two") })
	if got := p.setUps(); got[0] != "one" || strings.Count(strings.Join(got, ","), "one") != len(got)-1 {
		t.Errorf("set-ups saw %q, want one, then two", got)
	}
	e.unmount(pod)
	eventually(t, "the configMap released", func() bool { return len(e.vm.objects.Holders(ref)) == 0 })
}

// TestConfigMapVolumeKeptCurrent: the built-in configMap plugin writes a
// pod's configMap volume with the kubelet's layout, reports it read-only,
// and an update of the configMap reaches the file through the watch (the
// resync is a minute away), atomically through ..data.
func TestConfigMapVolumeKeptCurrent(t *testing.T) {
	e := newEnv(t, envOptions{})
	ctx := context.Background()
	cm, pod := mountSettings(t, e)
	mvs := e.vm.GetMountedVolumesForPod(pod.UID)
	want := filepath.Join(e.root, "pods", string(pod.UID), "volumes", "kubernetes.io~configmap", "conf")
	if len(mvs) != 1 || mvs[0].Path != want || mvs[0].Plugin != "kubernetes.io/configmap" || !mvs[0].ReadOnly {
		t.Fatalf("GetMountedVolumesForPod = %+v, want the configMap volume at %s, read-only", mvs, want)
	}
	read := func() string {
		data, _ := os.ReadFile(filepath.Join(want, "mode"))
		return string(data)
	}
	if got := read(); got != "one" {
		t.Fatalf("mode = %q, want one", got)
	}
	if target, err := os.Readlink(filepath.Join(want, "mode")); err != nil || target != "..data/mode" {
		t.Errorf("mode is a link to %q (%v), want ..data/mode", target, err)
	}
	cm.Data["mode"] = "two"
	if _, err := e.client.CoreV1().ConfigMaps("ns").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the update in the pod's file", func() bool { return read() == "two" })
	e.unmount(pod)
	if _, err := os.Lstat(want); !os.IsNotExist(err) {
		t.Errorf("the volume directory after the pod went: %v", err)
	}
}

// TestKubeAPIAccessVolume: the projected volume the API server adds to
// every pod (a service account token bound to the pod, the cluster's CA
// from kube-root-ca.crt, the namespace) is written as under the kubelet:
// token, ca.crt and namespace through ..data, the token requested once for
// the pod's service account, bound to the pod, and handed out again at the
// next publish rather than requested again.
func TestKubeAPIAccessVolume(t *testing.T) {
	ctx := context.Background()
	var requests []*authenticationv1.TokenRequest
	var mu sync.Mutex
	// The reactor before the manager's informers use the client: the
	// fake's reactor chain is not safe to change while it is in use.
	client := fake.NewClientset()
	client.PrependReactor("create", "serviceaccounts", func(a k8stesting.Action) (bool, runtime.Object, error) {
		tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenRequest).DeepCopy()
		mu.Lock()
		requests = append(requests, tr.DeepCopy())
		mu.Unlock()
		tr.Status = authenticationv1.TokenRequestStatus{Token: "token-1", ExpirationTimestamp: metav1.NewTime(time.Now().Add(time.Hour))}
		return true, tr, nil
	})
	e := newEnv(t, envOptions{client: client})
	ca := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "kube-root-ca.crt"}, Data: map[string]string{"ca.crt": "-----CA-----\n"}}
	if _, err := e.client.CoreV1().ConfigMaps("ns").Create(ctx, ca, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	access := kubeAPIAccess("kube-api-access-x7k2p")
	pod := csitest.Pod("ns", "web", csitest.PodSpec{ServiceAccount: "app", Volumes: []csitest.PodVolume{
		{Name: access.Name, Source: access.VolumeSource, ReadOnly: true},
	}})
	if err := e.mount(pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(e.root, "pods", string(pod.UID), "volumes", "kubernetes.io~projected", access.Name)
	for name, want := range map[string]string{"token": "token-1", "ca.crt": "-----CA-----\n", "namespace": "ns"} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || string(data) != want {
			t.Errorf("%s = %q, %v; want %q", name, data, err, want)
		}
		if target, _ := os.Readlink(filepath.Join(dir, name)); target != "..data/"+name {
			t.Errorf("%s links to %q, want ..data/%s", name, target, name)
		}
	}
	mu.Lock()
	if len(requests) != 1 {
		t.Fatalf("%d token requests, want 1", len(requests))
	}
	r := requests[0].Spec
	if b := r.BoundObjectRef; b == nil || b.Kind != "Pod" || b.Name != "web" || b.UID != pod.UID || *r.ExpirationSeconds != 3607 {
		t.Errorf("token request %+v, want one bound to the pod with expirationSeconds 3607", r)
	}
	mu.Unlock()
	// A new CA republishes the volume: the token is handed out again.
	eventually(t, "the object cache watching configMap ns/kube-root-ca.crt", func() bool {
		return watching(e.client, "configmaps", "ns", "kube-root-ca.crt")
	})
	ca.Data["ca.crt"] = "-----CA2-----\n"
	if _, err := e.client.CoreV1().ConfigMaps("ns").Update(ctx, ca, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the new CA in the pod's file", func() bool {
		data, _ := os.ReadFile(filepath.Join(dir, "ca.crt"))
		return string(data) == "-----CA2-----\n"
	})
	mu.Lock()
	if len(requests) != 1 {
		t.Errorf("%d token requests after the republish, want 1", len(requests))
	}
	mu.Unlock()
	e.unmount(pod)
}

// TestObjectCreatedLateSetsUpAtOnce: a configMap volume set up before its
// configMap exists fails and backs off; the configMap's creation, seen
// through the watch, sets it up at once: the fake clock never moves, so
// no backoff ends.
func TestObjectCreatedLateSetsUpAtOnce(t *testing.T) {
	e := newEnv(t, envOptions{clock: fakeclock.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))})
	pod := csitest.Pod("ns", "web", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "conf", Source: v1.VolumeSource{
		ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "late"}}}}}})
	e.vm.AddPod(pod)
	name := podvol.UniqueVolumeName(configmap.PluginName + "/" + string(pod.UID) + "-conf")
	eventually(t, "the volume backing off", func() bool { until, _ := backoffUntil(e.vm, name); return !until.IsZero() })
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "late"}, Data: map[string]string{"mode": "one"}}
	if _, err := e.client.CoreV1().ConfigMaps("ns").Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.vm.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatalf("the configMap created while its volume backs off: %v", err)
	}
}

// backoffUntil returns when the volume's backoff ends (the zero time when
// it has none) and the failure it backs off from, read on the loop's
// goroutine.
func backoffUntil(vm *VolumeManager, name podvol.UniqueVolumeName) (until time.Time, lastErr error) {
	done := make(chan struct{})
	vm.inspect <- func(l *reconciler.Loop) {
		for _, e := range l.Backoff(name) {
			if e.Until.After(until) {
				until, lastErr = e.Until, e.LastErr
			}
		}
		close(done)
	}
	<-done
	return until, lastErr
}

// TestObjectDeletedWhileMounted: a configMap deleted while a pod has it
// mounted leaves the pod's files as they were and the volume mounted (the
// republish fails with the kubelet's "not found", and is retried); the
// configMap created again reaches the files.
func TestObjectDeletedWhileMounted(t *testing.T) {
	e := newEnv(t, envOptions{})
	ctx := context.Background()
	cm, pod := mountSettings(t, e)
	file := filepath.Join(e.root, "pods", string(pod.UID), "volumes", "kubernetes.io~configmap", "conf", "mode")
	read := func() string { data, _ := os.ReadFile(file); return string(data) }
	if err := e.client.CoreV1().ConfigMaps("ns").Delete(ctx, "settings", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	name := podvol.UniqueVolumeName("kubernetes.io/configmap/" + string(pod.UID) + "-conf")
	eventually(t, "the republish of the deleted configMap failing", func() bool { until, _ := backoffUntil(e.vm, name); return !until.IsZero() })
	if got := read(); got != "one" {
		t.Errorf("the file after the configMap was deleted = %q, want the old content", got)
	}
	if mvs := e.vm.GetMountedVolumesForPod(pod.UID); len(mvs) != 1 {
		t.Errorf("mounted volumes after the configMap was deleted: %+v, want it still mounted", mvs)
	}
	cm.Data["mode"] = "two"
	cm.ResourceVersion = ""
	if _, err := e.client.CoreV1().ConfigMaps("ns").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the configMap created again in the file", func() bool { return read() == "two" })
	e.unmount(pod)
}

// mountSettings creates configMap ns/settings (mode: one) and mounts pod
// ns/web with it as volume "conf".
func mountSettings(t *testing.T, e *env) (*v1.ConfigMap, *v1.Pod) {
	t.Helper()
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "settings"}, Data: map[string]string{"mode": "one"}}
	if _, err := e.client.CoreV1().ConfigMaps("ns").Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := csitest.Pod("ns", "web", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "conf", Source: v1.VolumeSource{
		ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "settings"}}}}}})
	if err := e.mount(pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// The fake clientset's watch sees only the changes made after it is
	// registered: a change between the object cache's list and its watch
	// would be lost (a real API server resumes from the list's resource
	// version), and found only by the resync a minute away.
	eventually(t, "the object cache watching configMap ns/settings", func() bool { return watching(e.client, "configmaps", "ns", "settings") })
	return cm, pod
}

// watching reports whether client has been asked to watch the object
// name of resource in namespace ns (by the field selector the object
// cache watches one object with). The fake clientset records the action
// under the lock it registers the watch under: once it is listed, the
// watch sees every later change.
func watching(client *fake.Clientset, resource, ns, name string) bool {
	want := fields.OneTermEqualSelector("metadata.name", name).String()
	for _, a := range client.Actions() {
		w, ok := a.(k8stesting.WatchAction)
		if ok && w.GetResource().Resource == resource && w.GetNamespace() == ns && w.GetWatchRestrictions().Fields.String() == want {
			return true
		}
	}
	return false
}
