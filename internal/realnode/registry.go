package realnode

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// Registry serves images built here over the registry API (the OCI
// distribution API's pull side, read-only, plain HTTP), for a node whose
// runtime pulls: a spec that creates a pod with pull policy Always, or
// runs after the kubelet's image garbage collector removed an image under
// disk pressure, pulls it again from here (Options.Mirror), never from
// outside the machine. It holds only what NewRegistry was given, with the
// same digests ImportImages gives them.
type Registry struct {
	// manifests maps "repository:tag" and "repository@digest" to an
	// image's manifest; blobs a digest to its config or layer.
	manifests map[string][]byte
	blobs     map[string][]byte
}

// RegistryHost is the registry the suites' images are named in, the one a
// Registry stands in for.
const RegistryHost = "registry.k8s.io"

// NewRegistry builds images (each named in RegistryHost) to serve them.
func NewRegistry(images ...Image) (*Registry, error) {
	r := &Registry{manifests: map[string][]byte{}, blobs: map[string][]byte{}}
	for _, img := range images {
		repo, tag, ok := strings.Cut(strings.TrimPrefix(img.Name, RegistryHost+"/"), ":")
		if !ok || !strings.HasPrefix(img.Name, RegistryHost+"/") {
			return nil, fmt.Errorf("realnode: registry: image %s is not named repository:tag in %s", img.Name, RegistryHost)
		}
		b, err := build(img)
		if err != nil {
			return nil, err
		}
		r.manifests[repo+":"+tag] = b.manifest
		r.manifests[repo+"@"+b.manifestDesc.Digest] = b.manifest
		r.blobs[b.configDesc.Digest] = b.config
		r.blobs[b.layerDesc.Digest] = b.layer
	}
	return r, nil
}

// ServeHTTP answers GET and HEAD of /v2/, of
// /v2/{repository}/manifests/{tag or digest} and of
// /v2/{repository}/blobs/{digest}; anything else is 404 (405 for another
// method).
func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		http.Error(w, "read-only registry", http.StatusMethodNotAllowed)
		return
	}
	path := req.URL.Path
	if path == "/v2/" || path == "/v2" {
		w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
		return
	}
	var data []byte
	var media, digest string
	if repo, ref, ok := strings.Cut(strings.TrimPrefix(path, "/v2/"), "/manifests/"); ok {
		sep := ":"
		if strings.HasPrefix(ref, "sha256:") {
			sep = "@"
		}
		data, media = r.manifests[repo+sep+ref], mediaManifest
		if data != nil {
			digest = blobDesc(mediaManifest, data).Digest
		}
	} else if _, d, ok := strings.Cut(path, "/blobs/"); ok && strings.HasPrefix(path, "/v2/") {
		data, media, digest = r.blobs[d], "application/octet-stream", d
	}
	if data == nil {
		http.Error(w, `{"errors":[{"code":"NAME_UNKNOWN","message":"not served here"}]}`, http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", media)
	w.Header().Set("Docker-Content-Digest", digest)
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	if req.Method == http.MethodGet {
		_, _ = w.Write(data)
	}
}
