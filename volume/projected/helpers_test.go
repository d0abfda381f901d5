package projected

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/internal/objvolume/objtest"
)

func ptr[T any](v T) *T { return &v }

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

func (f *fakeCerts) Credentials(_ context.Context, pod podvol.PodRef, vol string, i int, src *v1.PodCertificateProjection) ([]byte, []byte, error) {
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
	objs   *objtest.Objects
	tokens *fakeTokens
	certs  *fakeCerts
	steps  *objtest.Steps
}

func newEnv(t *testing.T, root string, m *mount.FakeMounter) *env {
	t.Helper()
	if root == "" {
		root = t.TempDir()
	}
	if m == nil {
		m = mount.NewFakeMounter(nil)
	}
	e := &env{root: root, fake: m, objs: &objtest.Objects{}, tokens: &fakeTokens{}, certs: &fakeCerts{key: "KEY\n", chain: "CHAIN\n"},
		steps: &objtest.Steps{}}
	p, err := newPlugin(Config{RootDir: root, Mounter: m, Objects: e.objs, Tokens: e.tokens, PodCertificates: e.certs,
		NodeAllocatable: func() (v1.ResourceList, error) {
			return v1.ResourceList{v1.ResourceMemory: resource.MustParse("8Gi"), v1.ResourceCPU: resource.MustParse("4")}, nil
		},
		Steps: e.steps.Take})
	if err != nil {
		t.Fatal(err)
	}
	e.plugin = p
	return e
}

// testPod is pod ns/pod of service account "app" with one container "c"
// with a 64Mi memory limit, labelled app=web.
func testPod() *v1.Pod {
	p := &v1.Pod{Spec: v1.PodSpec{ServiceAccountName: "app", Containers: []v1.Container{{Name: "c",
		Resources: v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceMemory: resource.MustParse("64Mi")}}}}}}
	p.Namespace, p.Name, p.UID, p.Labels = objtest.NS, "pod", objtest.UID, map[string]string{"app": "web"}
	return p
}

// spec is the spec the volume manager gives pod's volume name, resolved.
func (e *env) spec(t *testing.T, pod *v1.Pod, name string, src v1.ProjectedVolumeSource) *podvol.VolumeSpec {
	t.Helper()
	s := newSpec(name, src)
	if err := e.ResolveSpec(pod, s); err != nil {
		t.Fatalf("ResolveSpec: %v", err)
	}
	return s
}

func newSpec(name string, src v1.ProjectedVolumeSource) *podvol.VolumeSpec {
	return &podvol.VolumeSpec{Name: podvol.UniqueVolumeName(PluginName + "/" + string(objtest.UID) + "-" + name), Plugin: PluginName,
		Mode: podvol.Filesystem, Ephemeral: true, Source: &v1.VolumeSource{Projected: &src}}
}

// request is the volume manager's request for pod's volume name.
func request(pod *v1.Pod, spec *podvol.VolumeSpec, name string, fsGroup *int64) volume.MountRequest {
	return volume.MountRequest{Spec: spec, Volume: podvol.PodVolume{
		Pod:      podvol.PodRef{UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name, ServiceAccount: pod.Spec.ServiceAccountName},
		SpecName: name, FSGroup: fsGroup}}
}

// dir is the directory of pod volume name.
func (e *env) dir(name string) string {
	return filepath.Join(e.root, "pods", string(objtest.UID), "volumes", "kubernetes.io~projected", name)
}

// selector is a label selector of one label.
func selector(k, v string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{k: v}}
}
