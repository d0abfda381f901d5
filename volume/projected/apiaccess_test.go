package projected

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/volume/internal/objvolume/objtest"
)

// kubeAPIAccess is the volume the API server's ServiceAccount admission
// adds to every pod, defaulted as the API server stores it.
func kubeAPIAccess() v1.ProjectedVolumeSource {
	return v1.ProjectedVolumeSource{
		DefaultMode: ptr[int32](420),
		Sources: []v1.VolumeProjection{
			{ServiceAccountToken: &v1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr[int64](3607)}},
			{ConfigMap: &v1.ConfigMapProjection{LocalObjectReference: v1.LocalObjectReference{Name: "kube-root-ca.crt"},
				Items: []v1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
			{DownwardAPI: &v1.DownwardAPIProjection{Items: []v1.DownwardAPIVolumeFile{
				{Path: "namespace", FieldRef: &v1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}},
		},
	}
}

const caCrt = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"

func kubeRootCA() *v1.ConfigMap {
	return objtest.ConfigMap("kube-root-ca.crt", map[string]string{"ca.crt": caCrt}, nil)
}

// TestKubeAPIAccess: the kube-api-access-* volume of every pod, as under
// the kubelet: the token of the pod's service account bound to the pod
// for 3607 s with the API server's audiences, the cluster's CA and the
// namespace, each a link through ..data, on a tmpfs with the wrapped
// emptyDir's ready file; with an fsGroup the token is 0640 of that group.
func TestKubeAPIAccess(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fsGroup *int64
		want    map[string]string
	}{{
		name: "no fsGroup",
		want: map[string]string{"token": own(0o644, "app-0"), "ca.crt": own(0o644, caCrt), "namespace": own(0o644, "ns")},
	}, {
		name:    "an fsGroup",
		fsGroup: ptr(int64(os.Getgid())),
		want:    map[string]string{"token": own(0o640, "app-0"), "ca.crt": own(0o644, caCrt), "namespace": own(0o644, "ns")},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			e := newEnv(t, "", nil)
			e.objs.Put(kubeRootCA())
			pod, name := testPod(), "kube-api-access-x7k2q"
			src := kubeAPIAccess()
			if got, want := refs(objtest.NS, &src), []objectcache.Ref{{Kind: objectcache.ConfigMap, Namespace: objtest.NS, Name: "kube-root-ca.crt"}}; !slices.Equal(got, want) {
				t.Errorf("Refs = %v, want %v", got, want)
			}
			spec := e.spec(t, pod, name, src)
			dir, err := e.SetUp(ctx, request(pod, spec, name, tc.fsGroup))
			if err != nil {
				t.Fatal(err)
			}
			if got := objtest.ReadVolume(t, dir, true); !maps.Equal(got, tc.want) {
				t.Errorf("files %v, want %v", got, tc.want)
			}
			for _, f := range []string{"token", "ca.crt", "namespace"} {
				if target, err := os.Readlink(filepath.Join(dir, f)); err != nil || target != "..data/"+f {
					t.Errorf("%s links to %q (%v), want ..data/%s", f, target, err, f)
				}
			}
			if !objtest.Exists(t, filepath.Join(e.root, "pods", string(objtest.UID), "plugins", "kubernetes.io~empty-dir", "wrapped_"+name, "ready")) {
				t.Error("no ready file of the wrapped emptyDir")
			}
			want := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr[int64](3607),
				BoundObjectRef: &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Pod", Name: "pod", UID: objtest.UID}}}
			if len(e.tokens.requests) != 1 || !reflect.DeepEqual(e.tokens.requests[0], want) || e.tokens.accounts[0] != "ns/app" {
				t.Errorf("token requests %+v for %v, want one %+v for ns/app", e.tokens.requests, e.tokens.accounts, want)
			}
		})
	}
}

// TestKubeAPIAccessWithoutCA: before kube-root-ca.crt reaches the
// namespace, the kubelet's error, and nothing set up.
func TestKubeAPIAccessWithoutCA(t *testing.T) {
	e := newEnv(t, "", nil)
	pod := testPod()
	spec := e.spec(t, pod, "kube-api-access-x7k2q", kubeAPIAccess())
	_, err := e.SetUp(context.Background(), request(pod, spec, "kube-api-access-x7k2q", nil))
	if err == nil || err.Error() != `setting up projected volume "kube-api-access-x7k2q" of pod ns/pod: configmap "kube-root-ca.crt" not found` {
		t.Errorf("SetUp: %v", err)
	}
	if objtest.Exists(t, filepath.Join(e.root, "pods")) {
		t.Error("the failed SetUp made the pod's directories")
	}
}
