package volumemanager

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/testenv"
	"github.com/nodevol/nodevol/volume/configmap"
	"github.com/nodevol/nodevol/volume/downwardapi"
	"github.com/nodevol/nodevol/volume/secret"
)

// apiRequest is one request of a client, as the API server answered it.
type apiRequest struct {
	verb      string // GET, LIST, WATCH, POST, PUT, PATCH, DELETE
	resource  string // as resourceOf names it
	namespace string
	name      string // the path's object, or a fieldSelector's metadata.name
	// initial: a watch-list request (a WATCH with sendInitialEvents=true,
	// which streams the objects before their changes).
	initial bool
	status  int
}

func (r apiRequest) String() string {
	verb := r.verb
	if r.initial {
		verb += " (watch-list)"
	}
	return fmt.Sprintf("%s %s %s/%s: %d", verb, r.resource, r.namespace, r.name, r.status)
}

// requestLog records a client's requests, and counts its watches still
// open (their response body not closed yet) by "resource ns/name".
type requestLog struct {
	mu   sync.Mutex
	reqs []apiRequest
	open map[string]int
}

func (l *requestLog) wrap(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = 100, 200
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			req := parseRequest(r)
			resp, err := rt.RoundTrip(r)
			if resp != nil {
				req.status = resp.StatusCode
			}
			l.mu.Lock()
			defer l.mu.Unlock()
			l.reqs = append(l.reqs, req)
			if err == nil && req.verb == "WATCH" && resp.StatusCode == http.StatusOK {
				key := req.resource + " " + req.namespace + "/" + req.name
				if l.open == nil {
					l.open = map[string]int{}
				}
				l.open[key]++
				resp.Body = &watchBody{ReadCloser: resp.Body, closed: func() {
					l.mu.Lock()
					defer l.mu.Unlock()
					l.open[key]--
				}}
			}
			return resp, err
		})
	})
	return cfg
}

// watchBody is a watch's response body that tells when it is closed.
type watchBody struct {
	io.ReadCloser
	once   sync.Once
	closed func()
}

func (b *watchBody) Close() error {
	b.once.Do(b.closed)
	return b.ReadCloser.Close()
}

// parseRequest names a request's verb, resource, namespace and object.
func parseRequest(r *http.Request) apiRequest {
	req := apiRequest{verb: r.Method, resource: resourceOf(r.URL.Path)}
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	}
	if len(parts) > 2 && parts[0] == "namespaces" {
		req.namespace, parts = parts[1], parts[2:]
	}
	if len(parts) >= 2 {
		req.name = parts[1]
	} else if sel, err := fields.ParseSelector(r.URL.Query().Get("fieldSelector")); err == nil {
		req.name, _ = sel.RequiresExactMatch("metadata.name")
	}
	if r.Method == http.MethodGet && len(parts) == 1 {
		req.verb = "LIST"
		if r.URL.Query().Get("watch") == "true" {
			req.verb = "WATCH"
			req.initial = r.URL.Query().Get("sendInitialEvents") == "true"
		}
	}
	return req
}

// requests returns the requests so far, those of resources only if any
// are named.
func (l *requestLog) requests(resources ...string) []apiRequest {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []apiRequest
	for _, r := range l.reqs {
		if len(resources) == 0 || slices.Contains(resources, r.resource) {
			out = append(out, r)
		}
	}
	return out
}

// openWatches returns the number of watches of resource ns/name still open.
func (l *requestLog) openWatches(resource, ns, name string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open[resource+" "+ns+"/"+name]
}

// objectsEnv is a volume manager with a node's own credentials (the Node
// authorizer, NodeRestriction) against a real API server, its requests
// logged, on the fake mounter in a temporary root.
type objectsEnv struct {
	admin   kubernetes.Interface
	nodeCfg *rest.Config
	log     *requestLog
	vm      *VolumeManager
	root    string
	mounter *mount.FakeMounter
}

const objectsNS = "apps"

// startObjectsEnv starts the API server, creates the namespace and this
// node's Node (as a kubelet does) and runs a volume
// manager until the test ends.
func startObjectsEnv(t *testing.T) *objectsEnv {
	t.Helper()
	return startObjectsEnvWith(t, nil)
}

// startObjectsEnvWith is startObjectsEnv with the manager's Config changed
// by configure, if set, before New.
func startObjectsEnvWith(t *testing.T, configure func(*Config)) *objectsEnv {
	t.Helper()
	env := testenv.StartT(t, testenv.Options{
		AuthorizationModes:     []string{"Node", "RBAC"},
		EnableAdmissionPlugins: []string{"NodeRestriction"},
	})
	ctx := t.Context()
	adminCfg := env.Config()
	adminCfg.QPS, adminCfg.Burst = 100, 200 // the default 5 per second would pace the updates
	e := &objectsEnv{admin: kubernetes.NewForConfigOrDie(adminCfg), log: &requestLog{}, root: t.TempDir(), mounter: mount.NewFakeMounter(nil)}
	var err error
	if e.nodeCfg, err = env.CertConfig(testenv.User{Name: "system:node:" + node, Groups: []string{"system:nodes"}}); err != nil {
		t.Fatal(err)
	}
	nodeClient := kubernetes.NewForConfigOrDie(e.log.wrap(e.nodeCfg))
	if _, err := e.admin.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: objectsNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := nodeClient.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := Config{NodeName: node, KubeClient: nodeClient, RootDir: e.root, Mounter: e.mounter}
	if configure != nil {
		configure(&cfg)
	}
	if e.vm, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- e.vm.Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-done })
	e.vm.MarkPodsSynced()
	return e
}

// createObjects creates configMaps (data) and secrets (stringData) as the
// admin.
func (e *objectsEnv) createObjects(t *testing.T, configMaps, secrets map[string]map[string]string) {
	t.Helper()
	for name, data := range configMaps {
		cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: objectsNS, Name: name}, Data: data}
		if _, err := e.admin.CoreV1().ConfigMaps(objectsNS).Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for name, data := range secrets {
		s := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: objectsNS, Name: name}, StringData: data}
		if _, err := e.admin.CoreV1().Secrets(objectsNS).Create(t.Context(), s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// createPod creates pod as the admin (the scheduler's binding included)
// and returns it as the API server stored it.
func (e *objectsEnv) createPod(t *testing.T, pod *v1.Pod) *v1.Pod {
	t.Helper()
	pod.UID = ""
	created, err := e.admin.CoreV1().Pods(pod.Namespace).Create(t.Context(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return created
}

// waitAuthorized waits until the Node authorizer lets this node get the
// objects: its graph learns a new pod's references from its own watch of
// pods, a moment after the create returns (a kubelet learns the pod from
// a watch too, later still). Asked as the admin, so that the node's log
// stays the volume manager's.
func (e *objectsEnv) waitAuthorized(t *testing.T, refs ...objectcache.Ref) {
	t.Helper()
	for _, r := range refs {
		resource := map[objectcache.Kind]string{objectcache.ConfigMap: "configmaps", objectcache.Secret: "secrets"}[r.Kind]
		eventually(t, "the Node authorizer to allow "+r.String(), func() bool {
			review, err := e.admin.AuthorizationV1().SubjectAccessReviews().Create(t.Context(), nodeAccessReview(resource, r.Namespace, r.Name), metav1.CreateOptions{})
			return err == nil && review.Status.Allowed
		})
	}
}

// mountPod adds pod to the volume manager and waits for its volumes.
func (e *objectsEnv) mountPod(t *testing.T, pod *v1.Pod) {
	t.Helper()
	if err := e.vm.AddPod(pod); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := e.vm.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}
}

// volumeDir is pod's volume name of a plugin (its directory name, say
// kubernetes.io~configmap) under the root.
func (e *objectsEnv) volumeDir(pod *v1.Pod, pluginDir, name string) string {
	return filepath.Join(e.root, "pods", string(pod.UID), "volumes", pluginDir, name)
}

// pluginDir is the directory of a plugin's volumes: kubernetes.io~configmap.
func pluginDir(plugin string) string { return strings.ReplaceAll(plugin, "/", "~") }

// readFile reads a file, "" when it cannot be read.
func readFile(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return string(b)
}

// objectVolume returns a volume of a configMap, secret or downward API
// (the pod's labels) source.
func objectVolume(name string, cm, sec string, labels bool) csitest.PodVolume {
	v := csitest.PodVolume{Name: name}
	switch {
	case cm != "":
		v.Source.ConfigMap = &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: cm}}
	case sec != "":
		v.Source.Secret = &v1.SecretVolumeSource{SecretName: sec}
	case labels:
		v.Source.DownwardAPI = &v1.DownwardAPIVolumeSource{Items: []v1.DownwardAPIVolumeFile{
			{Path: "labels", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.labels"}}}}
	}
	return v
}

// TestIntegrationObjectVolumes runs a pod with a configMap, a secret and a
// downward API volume under a node's own credentials (the Node authorizer
// and NodeRestriction): the files hold the objects; each object costs one
// list and one watch of that object alone, and nothing of another pod's;
// an object no pod of the node references is refused to the node (the
// authorizer is on) and never asked for; a label change reaches the
// downward API file; the pod's deletion ends the watches and removes the
// volumes.
func TestIntegrationObjectVolumes(t *testing.T) {
	e := startObjectsEnv(t)
	ctx := t.Context()
	e.createObjects(t, map[string]map[string]string{
		"settings": {"mode": "one"}, "foreign-settings": {"mode": "foreign"}, "unreferenced": {"mode": "nobody's"},
	}, map[string]map[string]string{"token": {"key": "s3cret"}, "foreign-token": {"key": "foreign"}})
	// A pod of another node holding objects of its own: the node may not
	// read them and nodevol must not try.
	e.createPod(t, csitest.Pod(objectsNS, "foreign", csitest.PodSpec{Node: "node-2", Volumes: []csitest.PodVolume{
		objectVolume("conf", "foreign-settings", "", false),
		objectVolume("creds", "", "foreign-token", false),
	}}))
	pod := csitest.Pod(objectsNS, "web", csitest.PodSpec{Node: node, Volumes: []csitest.PodVolume{
		objectVolume("conf", "settings", "", false),
		objectVolume("creds", "", "token", false),
		objectVolume("info", "", "", true),
	}})
	pod.Labels = map[string]string{"app": "web"}
	pod = e.createPod(t, pod)
	cmRef := objectcache.Ref{Kind: objectcache.ConfigMap, Namespace: objectsNS, Name: "settings"}
	secRef := objectcache.Ref{Kind: objectcache.Secret, Namespace: objectsNS, Name: "token"}
	e.waitAuthorized(t, cmRef, secRef)

	// Mounted with the objects' content (the secret and the downward API
	// on a tmpfs, as the kubelet puts them), one list and one watch of
	// each object.
	start := time.Now()
	e.mountPod(t, pod)
	mountTime := time.Since(start)
	cmDir := e.volumeDir(pod, pluginDir(configmap.PluginName), "conf")
	secDir := e.volumeDir(pod, pluginDir(secret.PluginName), "creds")
	infoDir := e.volumeDir(pod, pluginDir(downwardapi.PluginName), "info")
	for path, want := range map[string]string{
		filepath.Join(cmDir, "mode"): "one", filepath.Join(secDir, "key"): "s3cret", filepath.Join(infoDir, "labels"): `app="web"`,
	} {
		if got := readFile(path); got != want {
			t.Errorf("%s = %q, want %q", path, got, want)
		}
	}
	e.checkMounts(t, infoDir, secDir) // the configMap's is on disk
	eventually(t, "the watches of the configMap and the secret", func() bool {
		return e.log.openWatches("configmaps", objectsNS, "settings") == 1 && e.log.openWatches("secrets", objectsNS, "token") == 1
	})
	t.Logf("mounted a pod with a configMap, a secret and a downward API volume in %v; its requests: %v",
		mountTime.Round(time.Millisecond), e.log.requests())
	checkObjectRequests(t, e.log, "settings", "token")

	// An object no pod of the node references: refused to the node.
	e.checkNodeReads(t, map[string]bool{"unreferenced": false, "foreign-settings": false, "settings": true})

	// A label change reaches the downward API file.
	pod.Labels = map[string]string{"app": "web", "tier": "front"}
	updated, err := e.admin.CoreV1().Pods(objectsNS).Update(ctx, pod, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.vm.UpdatePod(updated); err != nil {
		t.Fatal(err)
	}
	wantLabels := "app=\"web\"\ntier=\"front\""
	eventually(t, "the new labels in the downward API file", func() bool { return readFile(filepath.Join(infoDir, "labels")) == wantLabels })

	// The pod deleted: its watches end, its volumes go; still one
	// watch-list request of each object over the pod's whole life, no 403.
	e.deletePod(t, updated)
	eventually(t, "the objects released and their watches ended", func() bool {
		return len(e.vm.objects.Holders(cmRef)) == 0 && len(e.vm.objects.Holders(secRef)) == 0 &&
			e.log.openWatches("configmaps", objectsNS, "settings") == 0 && e.log.openWatches("secrets", objectsNS, "token") == 0
	})
	for _, dir := range []string{cmDir, secDir, infoDir} {
		if _, err := os.Lstat(dir); !os.IsNotExist(err) {
			t.Errorf("%s after the pod's deletion: %v, want it gone", dir, err)
		}
	}
	e.checkMounts(t)
	checkObjectRequests(t, e.log, "settings", "token")
}

// checkMounts checks that the fake mount table holds tmpfs mounts at the
// paths given and nothing else.
func (e *objectsEnv) checkMounts(t *testing.T, tmpfs ...string) {
	t.Helper()
	mps, err := e.mounter.List()
	var got []string
	for _, mp := range mps {
		got = append(got, mp.Type+" "+mp.Path)
	}
	var want []string
	for _, p := range tmpfs {
		want = append(want, "tmpfs "+p)
	}
	if slices.Sort(got); err != nil || !slices.Equal(got, want) {
		t.Errorf("mounts %v (%v), want %v", got, err, want)
	}
}

// checkNodeReads checks that the node, with its own client, may get the
// configMaps it should and is refused (Forbidden) the others: the Node
// authorizer is on.
func (e *objectsEnv) checkNodeReads(t *testing.T, allowed map[string]bool) {
	t.Helper()
	client := kubernetes.NewForConfigOrDie(e.nodeCfg) // not logged: the log is the volume manager's
	for name, ok := range allowed {
		_, err := client.CoreV1().ConfigMaps(objectsNS).Get(t.Context(), name, metav1.GetOptions{})
		if ok && err != nil || !ok && !apierrors.IsForbidden(err) {
			t.Errorf("the node's own GET of configMap %s: %v, want allowed %v (else Forbidden)", name, err, ok)
		}
	}
}

// deletePod deletes pod from the API server and the volume manager, and
// waits for its volumes to be unmounted.
func (e *objectsEnv) deletePod(t *testing.T, pod *v1.Pod) {
	t.Helper()
	if err := e.admin.CoreV1().Pods(pod.Namespace).Delete(t.Context(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))}); err != nil {
		t.Fatal(err)
	}
	e.vm.DeletePod(pod)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := e.vm.WaitForUnmount(ctx, pod); err != nil {
		t.Fatal(err)
	}
}

// checkObjectRequests checks the log's requests of configMaps and
// secrets: one watch-list request of the configMap cm and one of the
// secret sec, each by its name, and nothing else (no list: the watch reads
// the object, as the kubelet's reflectors do); and no request refused
// anywhere.
func checkObjectRequests(t *testing.T, log *requestLog, cm, sec string) {
	t.Helper()
	got := map[string]int{}
	for _, r := range log.requests("configmaps", "secrets") {
		got[fmt.Sprintf("%s %s %s/%s initial=%t", r.verb, r.resource, r.namespace, r.name, r.initial)]++
	}
	want := map[string]int{
		"WATCH configmaps " + objectsNS + "/" + cm + " initial=true": 1,
		"WATCH secrets " + objectsNS + "/" + sec + " initial=true":   1,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("requests of configMaps and secrets: %v, want %v", got, want)
	}
	for _, r := range log.requests() {
		if r.status == http.StatusForbidden {
			t.Errorf("refused: %v", r)
		}
	}
}

// nodeAccessReview asks whether this node may get core resource ns/name.
func nodeAccessReview(resource, ns, name string) *authorizationv1.SubjectAccessReview {
	return groupAccessReview("", resource, ns, name)
}

// groupAccessReview asks whether this node may get resource ns/name of
// API group group.
func groupAccessReview(group, resource, ns, name string) *authorizationv1.SubjectAccessReview {
	return &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: "system:node:" + node, Groups: []string{"system:nodes", "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: "get", Group: group, Resource: resource, Name: name},
	}}
}
