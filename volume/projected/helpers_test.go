package projected

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/cache"
	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/util/step"
	"github.com/nodevol/nodevol/volume"
)

const (
	testUID = types.UID("aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee")
	testNS  = "ns"
)

func ptr[T any](v T) *T { return &v }

// fakeObjects is the object cache of the tests: the objects put, found by
// a named Ref, and the ClusterTrustBundles, selected as the cache selects
// them. It records the selecting Refs listed.
type fakeObjects struct {
	mu      sync.Mutex
	objs    map[objectcache.Ref]runtime.Object
	bundles []*certificatesv1.ClusterTrustBundle
	listed  []objectcache.Ref
}

func (f *fakeObjects) Get(_ context.Context, ref objectcache.Ref) (runtime.Object, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ref.Kind == objectcache.ClusterTrustBundle {
		for _, b := range f.bundles {
			if b.Name == ref.Name {
				return b, nil
			}
		}
	}
	if o, ok := f.objs[ref]; ok {
		return o, nil
	}
	return nil, fmt.Errorf("reading %s: %w", ref, apierrors.NewNotFound(v1.Resource(strings.ToLower(string(ref.Kind))+"s"), ref.Name))
}

func (f *fakeObjects) List(_ context.Context, ref objectcache.Ref) ([]runtime.Object, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.listed = append(f.listed, ref)
	fs, err := fields.ParseSelector(ref.Fields)
	if err != nil {
		return nil, err
	}
	ls, err := labels.Parse(ref.Labels)
	if err != nil {
		return nil, err
	}
	var out []runtime.Object
	for _, b := range f.bundles {
		if ls.Matches(labels.Set(b.Labels)) && fs.Matches(fields.Set{"spec.signerName": b.Spec.SignerName}) {
			out = append(out, b)
		}
	}
	return out, nil
}

// put stores obj (a ConfigMap or a Secret of testNS) under its name.
func (f *fakeObjects) put(obj runtime.Object) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.objs == nil {
		f.objs = map[objectcache.Ref]runtime.Object{}
	}
	switch o := obj.(type) {
	case *v1.ConfigMap:
		f.objs[objectcache.Ref{Kind: objectcache.ConfigMap, Namespace: testNS, Name: o.Name}] = o
	case *v1.Secret:
		f.objs[objectcache.Ref{Kind: objectcache.Secret, Namespace: testNS, Name: o.Name}] = o
	}
}

func configMapOf(name string, data map[string]string) *v1.ConfigMap {
	cm := &v1.ConfigMap{Data: data}
	cm.Namespace, cm.Name = testNS, name
	return cm
}

func secretOf(name string, data map[string]string) *v1.Secret {
	s := &v1.Secret{Data: map[string][]byte{}}
	s.Namespace, s.Name = testNS, name
	for k, v := range data {
		s.Data[k] = []byte(v)
	}
	return s
}

func bundleOf(name, signer string, lbls map[string]string, pems ...string) *certificatesv1.ClusterTrustBundle {
	b := &certificatesv1.ClusterTrustBundle{Spec: certificatesv1.ClusterTrustBundleSpec{SignerName: signer, TrustBundle: strings.Join(pems, "")}}
	b.Name, b.Labels = name, lbls
	return b
}

// fakeTokens is the token cache of the tests: token "{sa}-{n}" for the
// n-th generation, handed out again until rotate.
type fakeTokens struct {
	mu       sync.Mutex
	gen      int
	err      error
	requests []*authenticationv1.TokenRequest
	accounts []string
}

func (f *fakeTokens) ServiceAccountToken(_ context.Context, ns, name string, tr *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests, f.accounts = append(f.requests, tr.DeepCopy()), append(f.accounts, ns+"/"+name)
	if f.err != nil {
		return nil, time.Time{}, f.err
	}
	out := tr.DeepCopy()
	out.Status.Token = fmt.Sprintf("%s-%d", name, f.gen)
	return out, time.Unix(0, 0), nil
}

// rotate makes the next token a new one, as the token cache does once a
// token is due for a refresh.
func (f *fakeTokens) rotate() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gen++
}

// fakeCerts is the pod certificate manager of the tests.
type fakeCerts struct {
	key, chain string
	err        error
	calls      []string
}

func (f *fakeCerts) Credentials(_ context.Context, pod cache.PodRef, vol string, i int, src *v1.PodCertificateProjection) ([]byte, []byte, error) {
	f.calls = append(f.calls, fmt.Sprintf("%s/%s %s %s[%d] %s", pod.Namespace, pod.Name, pod.UID, vol, i, src.SignerName))
	if f.err != nil {
		return nil, nil, f.err
	}
	return []byte(f.key), []byte(f.chain), nil
}

// env is a plugin on a temporary root, with the fakes, recording its
// steps.
type env struct {
	*plugin
	root   string
	fake   *mount.FakeMounter
	objs   *fakeObjects
	tokens *fakeTokens
	certs  *fakeCerts
	mu     sync.Mutex
	steps  []step.Step
}

func newEnv(t *testing.T, root string, m *mount.FakeMounter) *env {
	t.Helper()
	if root == "" {
		root = t.TempDir()
	}
	if m == nil {
		m = mount.NewFakeMounter(nil)
	}
	e := &env{root: root, fake: m, objs: &fakeObjects{}, tokens: &fakeTokens{}, certs: &fakeCerts{key: "KEY\n", chain: "CHAIN\n"}}
	p, err := newPlugin(Config{RootDir: root, Mounter: m, Objects: e.objs, Tokens: e.tokens, PodCertificates: e.certs,
		NodeAllocatable: func() (v1.ResourceList, error) {
			return v1.ResourceList{v1.ResourceMemory: resource.MustParse("8Gi"), v1.ResourceCPU: resource.MustParse("4")}, nil
		},
		Steps: func(s step.Step) error {
			e.mu.Lock()
			defer e.mu.Unlock()
			e.steps = append(e.steps, s)
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	e.plugin = p
	return e
}

// takeSteps returns the steps taken since the last call.
func (e *env) takeSteps() []step.Step {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.steps
	e.steps = nil
	return s
}

// testPod is pod ns/pod of service account "app" with one container "c"
// with a 64Mi memory limit, labelled app=web.
func testPod() *v1.Pod {
	p := &v1.Pod{Spec: v1.PodSpec{ServiceAccountName: "app", Containers: []v1.Container{{Name: "c",
		Resources: v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceMemory: resource.MustParse("64Mi")}}}}}}
	p.Namespace, p.Name, p.UID, p.Labels = testNS, "pod", testUID, map[string]string{"app": "web"}
	return p
}

// spec is the spec the volume manager gives pod's volume name, resolved.
func (e *env) spec(t *testing.T, pod *v1.Pod, name string, src v1.ProjectedVolumeSource) *cache.VolumeSpec {
	t.Helper()
	s := newSpec(name, src)
	if err := e.ResolveSpec(pod, s); err != nil {
		t.Fatalf("ResolveSpec: %v", err)
	}
	return s
}

func newSpec(name string, src v1.ProjectedVolumeSource) *cache.VolumeSpec {
	return &cache.VolumeSpec{Name: cache.UniqueVolumeName(PluginName + "/" + string(testUID) + "-" + name), Plugin: PluginName,
		Mode: cache.Filesystem, Ephemeral: true, Source: &v1.VolumeSource{Projected: &src}}
}

// request is the volume manager's request for pod's volume name.
func request(pod *v1.Pod, spec *cache.VolumeSpec, name string, fsGroup *int64) volume.MountRequest {
	return volume.MountRequest{Spec: spec, Volume: cache.PodVolume{
		Pod:      cache.PodRef{UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name, ServiceAccount: pod.Spec.ServiceAccountName},
		SpecName: name, FSGroup: fsGroup}}
}

// dir is the directory of pod volume name.
func (e *env) dir(name string) string {
	return filepath.Join(e.root, "pods", string(testUID), "volumes", "kubernetes.io~projected", name)
}

// readVolume returns what a container sees in dir: each file by its path
// through the user-visible links, as "mode:uid:gid:content" (uid and gid
// -1 unless withOwner).
func readVolume(t *testing.T, dir string, withOwner bool) map[string]string {
	t.Helper()
	out := map[string]string{}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "..") {
			readPath(t, dir, e.Name(), withOwner, out)
		}
	}
	return out
}

func readPath(t *testing.T, dir, rel string, withOwner bool, out map[string]string) {
	t.Helper()
	full := filepath.Join(dir, rel)
	fi, err := os.Stat(full)
	if err != nil {
		t.Fatal(err)
	}
	if fi.IsDir() {
		entries, err := os.ReadDir(full)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			readPath(t, dir, filepath.Join(rel, e.Name()), withOwner, out)
		}
		return
	}
	data, err := os.ReadFile(full)
	if err != nil {
		t.Fatal(err)
	}
	uid, gid := -1, -1
	if withOwner {
		st := fi.Sys().(*syscall.Stat_t)
		uid, gid = int(st.Uid), int(st.Gid)
	}
	out[rel] = fmt.Sprintf("%#o:%d:%d:%s", fi.Mode().Perm(), uid, gid, data)
}

func exists(t *testing.T, p string) bool {
	t.Helper()
	_, err := os.Lstat(p)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}

// selector is a label selector of one label.
func selector(k, v string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{k: v}}
}
