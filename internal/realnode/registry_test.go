package realnode

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// digestOf is data's digest, computed here rather than by the code under
// test.
func digestOf(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

var registryImage = Image{Name: RegistryHost + "/e2e-test-images/tiny:1.0",
	Files: []File{{Path: "/hello", Content: []byte("hello\n")}}, Cmd: []string{"/hello"}}

// TestRegistryServes: the registry answers the pull side of the registry
// API for what it holds (a manifest by tag and by digest, its blobs, each
// with its digest), and nothing else.
func TestRegistryServes(t *testing.T) {
	reg, err := NewRegistry(registryImage)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(reg)
	defer srv.Close()
	get := func(method, path string) (int, http.Header, []byte) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, resp.Header, body
	}
	if code, h, _ := get(http.MethodGet, "/v2/"); code != http.StatusOK || h.Get("Docker-Distribution-API-Version") != "registry/2.0" {
		t.Errorf("GET /v2/: %d %v", code, h)
	}
	code, h, manifest := get(http.MethodGet, "/v2/e2e-test-images/tiny/manifests/1.0")
	if code != http.StatusOK || h.Get("Content-Type") != mediaManifest || h.Get("Docker-Content-Digest") != digestOf(manifest) {
		t.Fatalf("GET the manifest by tag: %d %v", code, h)
	}
	b, err := build(registryImage)
	if err != nil {
		t.Fatal(err)
	}
	if string(manifest) != string(b.manifest) {
		t.Errorf("the manifest served is not the one ImportImages imports")
	}
	if code, h, body := get(http.MethodHead, "/v2/e2e-test-images/tiny/manifests/"+digestOf(manifest)); code != http.StatusOK || len(body) != 0 ||
		h.Get("Docker-Content-Digest") != digestOf(manifest) || h.Get("Content-Length") != fmt.Sprint(len(manifest)) {
		t.Errorf("HEAD the manifest by digest: %d %v %q", code, h, body)
	}
	for _, d := range []descriptor{b.configDesc, b.layerDesc} {
		if code, h, body := get(http.MethodGet, "/v2/e2e-test-images/tiny/blobs/"+d.Digest); code != http.StatusOK || digestOf(body) != d.Digest || h.Get("Docker-Content-Digest") != d.Digest {
			t.Errorf("GET blob %s: %d, digest %s", d.Digest, code, digestOf(body))
		}
	}
	for _, tc := range []struct{ method, path string }{
		{http.MethodGet, "/v2/e2e-test-images/tiny/manifests/2.0"},
		{http.MethodGet, "/v2/e2e-test-images/other/manifests/1.0"},
		{http.MethodGet, "/v2/e2e-test-images/tiny/blobs/sha256:00"},
		{http.MethodGet, "/elsewhere"},
	} {
		if code, _, _ := get(tc.method, tc.path); code != http.StatusNotFound {
			t.Errorf("%s %s: %d, want 404", tc.method, tc.path, code)
		}
	}
	if code, _, _ := get(http.MethodPut, "/v2/e2e-test-images/tiny/manifests/1.0"); code != http.StatusMethodNotAllowed {
		t.Errorf("PUT a manifest: %d, want 405", code)
	}
	if _, err := NewRegistry(Image{Name: "docker.io/library/busybox:1"}); err == nil {
		t.Error("an image of another registry: no error")
	}
}

// TestRuntimePullsFromMirror: with Options.Mirror, the CRI pulls the
// suites' registry's images from the Registry: an image removed (as the
// kubelet's image garbage collector removes one under disk pressure) is
// pulled back with the same ID, and an image the registry does not hold
// fails to pull, with nothing reached outside the machine.
func TestRuntimePullsFromMirror(t *testing.T) {
	reg, err := NewRegistry(registryImage)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(reg)
	defer srv.Close()
	dir, err := os.MkdirTemp("", "rn-")
	if err != nil {
		t.Fatal(err)
	}
	r := StartT(t, Options{Dir: dir, Mirror: srv.URL, Images: []Image{registryImage}})
	ctx := t.Context()
	images := r.Images()
	spec := &runtimeapi.ImageSpec{Image: registryImage.Name}
	before, err := images.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: spec})
	if err != nil || before.Image == nil {
		t.Fatalf("the imported image: %v, %v", before, err)
	}
	if _, err := images.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: spec}); err != nil {
		t.Fatal(err)
	}
	if st, err := images.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: spec}); err != nil || st.Image != nil {
		t.Fatalf("after RemoveImage: %v, %v; want no image", st, err)
	}
	pulled, err := images.PullImage(ctx, &runtimeapi.PullImageRequest{Image: spec})
	if err != nil {
		t.Fatalf("PullImage: %v (containerd's log: %s)", err, r.Log())
	}
	if pulled.ImageRef != before.Image.Id {
		t.Errorf("pulled image %s, want the imported one's ID %s", pulled.ImageRef, before.Image.Id)
	}
	if _, err := images.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: RegistryHost + "/e2e-test-images/tiny:9.9"}}); err == nil {
		t.Error("PullImage of a tag the registry does not hold: no error")
	}
}

// TestRegistryDirFiles: the files hold the image as agnhost's
// fake-registry-server reads a registry directory: the tag's file names
// the manifest's digest, and the manifest and every blob it names are at
// their digest's path, with that digest.
func TestRegistryDirFiles(t *testing.T) {
	files, err := RegistryDirFiles("/var/registry", "pause", "testing", registryImage)
	if err != nil {
		t.Fatal(err)
	}
	byPath := map[string][]byte{}
	for _, f := range files {
		byPath[f.Path] = f.Content
	}
	at := func(kind, digest string) []byte {
		t.Helper()
		h := strings.TrimPrefix(digest, "sha256:")
		data, ok := byPath["/var/registry/pause/"+kind+"/sha256/"+h[:2]+"/"+h+"/data"]
		if !ok || digestOf(data) != digest {
			t.Fatalf("%s %s: not at its path, or another digest", kind, digest)
		}
		return data
	}
	tagged, ok := byPath["/var/registry/pause/manifests/testing"]
	if !ok {
		t.Fatalf("no tag file in %d files", len(files))
	}
	var manifest struct {
		MediaType string
		Config    descriptor
		Layers    []descriptor
	}
	if err := json.Unmarshal(at("manifests", strings.TrimSpace(string(tagged))), &manifest); err != nil {
		t.Fatal(err)
	}
	if manifest.MediaType != mediaManifest || len(manifest.Layers) != 1 {
		t.Fatalf("manifest %+v", manifest)
	}
	b, err := build(registryImage)
	if err != nil {
		t.Fatal(err)
	}
	if string(at("blobs", manifest.Config.Digest)) != string(b.config) || string(at("blobs", manifest.Layers[0].Digest)) != string(b.layer) {
		t.Error("the blobs are not the image's")
	}
	if len(files) != 4 {
		t.Errorf("%d files, want the tag, the manifest and two blobs", len(files))
	}
}
