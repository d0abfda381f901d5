package objectcache

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// oldServer answers the cache's reads of ClusterTrustBundles as an API
// server does, through the real client-go clientset: as one that does
// not serve certificates.k8s.io/v1 ClusterTrustBundles (answer), until
// upgrade, then serving bundle "b" (a watch-list request streams it and
// the bookmark that ends the initial events; watches are held open).
type oldServer struct {
	answer   func(w http.ResponseWriter)
	upgraded atomic.Bool
}

func (s *oldServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !s.upgraded.Load() {
		s.answer(w)
		return
	}
	b := &certificatesv1.ClusterTrustBundle{
		TypeMeta:   metav1.TypeMeta{APIVersion: "certificates.k8s.io/v1", Kind: "ClusterTrustBundle"},
		ObjectMeta: metav1.ObjectMeta{Name: "b", ResourceVersion: "7"},
		Spec:       certificatesv1.ClusterTrustBundleSpec{SignerName: "s/a", TrustBundle: "pem"},
	}
	switch {
	case r.URL.Query().Get("watch") == "true":
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		if r.URL.Query().Get("sendInitialEvents") == "true" {
			end := &certificatesv1.ClusterTrustBundle{
				TypeMeta:   b.TypeMeta,
				ObjectMeta: metav1.ObjectMeta{ResourceVersion: "7", Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}},
			}
			enc := json.NewEncoder(w)
			_ = enc.Encode(map[string]any{"type": "ADDED", "object": b})
			_ = enc.Encode(map[string]any{"type": "BOOKMARK", "object": end})
		}
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	case strings.HasSuffix(r.URL.Path, "/clustertrustbundles/b"):
		writeJSON(w, http.StatusOK, b)
	default:
		writeJSON(w, http.StatusOK, &certificatesv1.ClusterTrustBundleList{
			TypeMeta: metav1.TypeMeta{APIVersion: "certificates.k8s.io/v1", Kind: "ClusterTrustBundleList"},
			ListMeta: metav1.ListMeta{ResourceVersion: "7"},
			Items:    []certificatesv1.ClusterTrustBundle{*b},
		})
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// muxStatus is a kube-apiserver's answer for a path of a group version it
// serves (certificates.k8s.io/v1, for CSRs) that no resource serves: its
// go-restful container's 404, a Status with empty details.
func muxStatus(w http.ResponseWriter) {
	st := apierrors.NewGenericServerResponse(http.StatusNotFound, "", schema.GroupResource{}, "", "", 0, false).ErrStatus
	st.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Status"}
	writeJSON(w, http.StatusNotFound, st)
}

// pageNotFound is the plain-text 404 of a path no handler serves.
func pageNotFound(w http.ResponseWriter) { http.NotFound(w, nil) }

// TestNotServed: an API server that does not serve certificates.k8s.io/v1
// ClusterTrustBundles (1.33 to 1.36) answers the cache's reads with its
// own 404, which client-go makes apierrors.IsNotFound as a missing
// object's. The cache tells them apart: the read fails with an error that
// wraps ErrNotServed, says what is needed and is not IsNotFound (a named
// bundle is not missing, an optional source not empty), in every mode and
// for a named and a selecting Ref; it is retried with backoff, and the
// bundle is read once the server serves it.
func TestNotServed(t *testing.T) {
	named, selecting := Ref{Kind: ClusterTrustBundle, Name: "b"}, Ref{Kind: ClusterTrustBundle, Fields: "spec.signerName=s/a"}
	for _, tc := range []struct {
		name   string
		answer func(http.ResponseWriter)
		mode   Mode
		ref    Ref
	}{
		{"mux Status, named, watched (a watch-list)", muxStatus, ModeWatch, named},
		{"mux Status, named, read by GET", muxStatus, ModeGet, named},
		{"mux Status, selecting, watched", muxStatus, ModeWatch, selecting},
		{"mux Status, selecting, listed", muxStatus, ModeGet, selecting},
		{"page not found, named, watched", pageNotFound, ModeWatch, named},
		{"page not found, named, read by GET", pageNotFound, ModeGet, named},
		{"page not found, selecting, listed", pageNotFound, ModeGet, selecting},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := &oldServer{answer: tc.answer}
			hs := httptest.NewServer(srv)
			t.Cleanup(hs.Close)
			fc := newFakeClock()
			c, _ := startOn(t, Config{Client: kubernetes.NewForConfigOrDie(&rest.Config{Host: hs.URL}), Clock: fc, Mode: tc.mode})
			c.Hold("pod", tc.ref)
			ctx, cancel := context.WithTimeout(context.Background(), guard)
			defer cancel()
			_, err := c.List(ctx, tc.ref)
			const want = "the API server does not serve certificates.k8s.io/v1 ClusterTrustBundles: a 1.37 or newer API server is needed (the server could not find the requested resource"
			if !errors.Is(err, ErrNotServed) || apierrors.IsNotFound(err) || !strings.Contains(err.Error(), want) {
				t.Fatalf("List: %v; want an error wrapping ErrNotServed, not NotFound, saying %q", err, want)
			}
			if tc.ref.Name != "" {
				if _, err := c.Get(ctx, tc.ref); !errors.Is(err, ErrNotServed) || apierrors.IsNotFound(err) {
					t.Fatalf("Get: %v; want ErrNotServed, not NotFound", err)
				}
			}
			srv.upgraded.Store(true)
			eventually(t, "the read retried after the upgrade", func() bool {
				fc.Step(time.Minute)
				objs, err := c.List(ctx, tc.ref)
				return err == nil && len(objs) == 1 && nameOf(objs[0]) == "b"
			})
		})
	}
}

// TestMissingIsNotFound: a missing object's 404 (from the resource's
// storage, its details naming it) stays apierrors.IsNotFound, not
// ErrNotServed.
func TestMissingIsNotFound(t *testing.T) {
	hs := httptest.NewServer(&oldServer{answer: func(w http.ResponseWriter) {
		st := apierrors.NewNotFound(certificatesv1.Resource("clustertrustbundles"), "b").ErrStatus
		st.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Status"}
		writeJSON(w, http.StatusNotFound, st)
	}})
	t.Cleanup(hs.Close)
	r := Ref{Kind: ClusterTrustBundle, Name: "b"}
	c, _ := startOn(t, Config{Client: kubernetes.NewForConfigOrDie(&rest.Config{Host: hs.URL}), Clock: newFakeClock(), Mode: ModeGet})
	c.Hold("pod", r)
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	if _, err := c.Get(ctx, r); !apierrors.IsNotFound(err) || errors.Is(err, ErrNotServed) {
		t.Fatalf("Get: %v; want NotFound", err)
	}
}
