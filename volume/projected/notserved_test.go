package projected

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/volume/internal/objvolume/objtest"
)

// notServingCache is a running object cache on an API server that does
// not serve certificates.k8s.io/v1 ClusterTrustBundles (1.33 to 1.36
// with the beta API): every read is answered with the 404 its mux gives a
// path of a served group version that no resource serves.
func notServingCache(t *testing.T) *objectcache.Cache {
	t.Helper()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		st := apierrors.NewGenericServerResponse(http.StatusNotFound, "", schema.GroupResource{}, "", "", 0, false).ErrStatus
		st.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Status"}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(st)
	}))
	t.Cleanup(hs.Close)
	c := objectcache.New(objectcache.Config{Client: kubernetes.NewForConfigOrDie(&rest.Config{Host: hs.URL})})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return c
}

// TestTrustBundleAPINotServed: against an API server that does not serve
// the ClusterTrustBundle API nodevol reads, a clusterTrustBundle source
// fails with an error naming the pod, the volume, the source and what is
// needed, not NotFound: a bundle by name is not reported missing, an
// optional one is not mounted as an empty file, and a signer's selection
// says the same. Nothing is set up.
func TestTrustBundleAPINotServed(t *testing.T) {
	signer := "example.com/signer"
	for _, tc := range []struct {
		name   string
		source *v1.ClusterTrustBundleProjection
		want   string
	}{{
		name:   "by name, optional",
		source: &v1.ClusterTrustBundleProjection{Name: ptr("b"), Optional: ptr(true), Path: "ca.pem"},
		want:   "while getting ClusterTrustBundle b:",
	}, {
		name:   "by name",
		source: &v1.ClusterTrustBundleProjection{Name: ptr("b"), Path: "ca.pem"},
		want:   "while getting ClusterTrustBundle b:",
	}, {
		name:   "by signer, optional",
		source: &v1.ClusterTrustBundleProjection{SignerName: &signer, LabelSelector: selector("tier", "x"), Optional: ptr(true), Path: "ca.pem"},
		want:   `while listing ClusterTrustBundles of signer example.com/signer matching label selector "tier=x":`,
	}, {
		name:   "by signer",
		source: &v1.ClusterTrustBundleProjection{SignerName: &signer, LabelSelector: selector("tier", "x"), Path: "ca.pem"},
		want:   `while listing ClusterTrustBundles of signer example.com/signer matching label selector "tier=x":`,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "", nil)
			objects := notServingCache(t)
			e.plugin.objects = objects
			pod := testPod()
			src := v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{{ClusterTrustBundle: tc.source}}}
			objects.Hold(string(pod.UID), refs(pod.Namespace, &src)...)
			spec := e.spec(t, pod, "vol", src)
			_, err := e.SetUp(context.Background(), request(pod, spec, "vol", nil))
			if err == nil {
				t.Fatal("SetUp succeeded, want the API not served")
			}
			for _, w := range []string{`setting up projected volume "vol" of pod ns/pod:`, tc.want,
				"the API server does not serve certificates.k8s.io/v1 ClusterTrustBundles: a 1.37 or newer API server is needed"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if !errors.Is(err, objectcache.ErrNotServed) || apierrors.IsNotFound(err) {
				t.Errorf("error %v: want ErrNotServed, not NotFound", err)
			}
			if objtest.Exists(t, filepath.Join(e.root, "pods")) {
				t.Error("the failed SetUp made the pod's directories")
			}
		})
	}
}
