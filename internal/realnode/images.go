package realnode

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// The images' names in upstream's suites (k8s.io/kubernetes
// test/utils/image/manifest.go, v1.37.2): imported under these exact names,
// they are never pulled.
const (
	// BusyboxImage is the suites' busybox.
	BusyboxImage = "registry.k8s.io/e2e-test-images/busybox:1.37.0-2"
	// PauseImage is the pod sandbox's image (containerd's sandbox_image).
	PauseImage = "registry.k8s.io/pause:3.10.2"
)

// File is one entry of an image's only layer. Exactly one of Source,
// Content, Link or Dir says what it is.
type File struct {
	// Path is its path in the image, absolute ("/bin/sh").
	Path string
	// Source is a file on this machine whose content it takes.
	Source string
	// Content is its content.
	Content []byte
	// Link makes it a symbolic link to Link.
	Link string
	// Dir makes it a directory.
	Dir bool
	// Mode is its Unix permission bits, sticky bit included (0o1777 for
	// /tmp). Unset: 0755 for a directory or a Source file that is
	// executable, 0644 otherwise.
	Mode uint32
}

// Image is an image built here: one layer of Files, and the config a
// container of it starts with.
type Image struct {
	// Name is the name it is imported under, with its tag
	// ("registry.k8s.io/pause:3.10.2").
	Name string
	// Files is its layer. Parent directories are added as needed.
	Files []File
	// Entrypoint and Cmd are the container's default command.
	Entrypoint, Cmd []string
	// Env is the container's environment; PATH is always set.
	Env []string
	// User is the user it runs as. Unset: root.
	User string
}

// defaultPath is the PATH of every image, as busybox's and most images
// have it.
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// BusyboxFiles are a root file system from the static busybox bin, or
// this machine's (Debian's busybox-static) when bin is empty: /bin/busybox,
// every applet as a relative link to it (an absolute one would name the
// host's path) at its own place and in /bin, the directories a program
// expects (/tmp sticky and world-writable) and /etc/passwd and /etc/group
// with root and nobody.
// Debian's busybox has fewer applets than upstream's image (no nmeter,
// pgrep, flock, nohup, ...); the conformance runs use one built with
// busybox's default configuration instead.
func BusyboxFiles(ctx context.Context, bin string) ([]File, error) {
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("busybox"); err != nil {
			return nil, fmt.Errorf("busybox for the images (Debian's busybox-static): %w", err)
		}
	}
	if err := checkStatic(bin); err != nil {
		return nil, err
	}
	out, err := exec.CommandContext(ctx, bin, "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("listing %s's applets: %w", bin, err)
	}
	files := []File{
		{Path: "/bin/busybox", Source: bin, Mode: 0o755},
		{Path: "/tmp", Dir: true, Mode: 0o1777},
		{Path: "/root", Dir: true, Mode: 0o700},
		{Path: "/var", Dir: true},
		{Path: "/home", Dir: true},
		{Path: "/etc/passwd", Content: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n")},
		{Path: "/etc/group", Content: []byte("root:x:0:\nnobody:x:65534:\n")},
	}
	// Every applet at the place busybox names, and in /bin as well, as
	// upstream's image has them (busybox --install /bin): specs run
	// /bin/sysctl, which busybox puts in /sbin.
	have := map[string]bool{"/bin/busybox": true}
	for applet := range strings.Lines(string(out)) {
		applet = "/" + strings.TrimSpace(applet)
		if applet == "/" {
			continue
		}
		for _, p := range []string{applet, "/bin/" + path.Base(applet)} {
			if have[p] {
				continue
			}
			have[p] = true
			rel, err := filepath.Rel(path.Dir(p), "/bin/busybox")
			if err != nil {
				return nil, err
			}
			files = append(files, File{Path: p, Link: rel})
		}
	}
	return files, nil
}

// checkStatic fails unless bin is a static executable: an image holds
// nothing else it could load.
func checkStatic(bin string) error {
	f, err := elf.Open(bin)
	if err != nil {
		return fmt.Errorf("%s: %w", bin, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked: the images need a static busybox (Debian's busybox-static)", bin)
		}
	}
	return nil
}

// HostProgram is this machine's program bin as files of an image: bin at
// path and, when it is dynamically linked, each shared library and the
// loader it loads, at the paths ldd names (the loader finds them there, in
// its built-in directories). It puts a Debian program where an image of
// upstream's has an Alpine package (curl, bash) or its own build (nginx).
func HostProgram(ctx context.Context, bin, path string) ([]File, error) {
	if checkStatic(bin) == nil {
		return []File{{Path: path, Source: bin}}, nil
	}
	out, err := exec.CommandContext(ctx, "ldd", bin).Output()
	if err != nil {
		return nil, fmt.Errorf("the libraries of %s (ldd): %w", bin, err)
	}
	files := []File{{Path: path, Source: bin}}
	for line := range strings.Lines(string(out)) {
		// "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x...)",
		// "/lib64/ld-linux-x86-64.so.2 (0x...)" or the kernel's
		// "linux-vdso.so.1 (0x...)", which no file holds.
		switch f := strings.Fields(line); {
		case len(f) >= 3 && f[1] == "=>":
			if !filepath.IsAbs(f[2]) { // "libx.so.1 => not found"
				return nil, fmt.Errorf("%s needs %s, which this machine lacks (ldd: %s)", bin, f[0], strings.TrimSpace(line))
			}
			files = append(files, File{Path: f[2], Source: f[2]})
		case len(f) >= 1 && filepath.IsAbs(f[0]):
			files = append(files, File{Path: f[0], Source: f[0]})
		}
	}
	return files, nil
}

// Busybox is the suites' busybox image from BusyboxFiles(ctx, bin),
// starting sh.
func Busybox(ctx context.Context, bin string) (Image, error) {
	files, err := BusyboxFiles(ctx, bin)
	if err != nil {
		return Image{}, err
	}
	return Image{Name: BusyboxImage, Files: files, Cmd: []string{"sh"}}, nil
}

// Pause is the sandbox image: the pause command of this module
// (internal/realnode/pause), built static into dir.
func Pause(ctx context.Context, dir string) (Image, error) {
	bin := filepath.Join(dir, "pause")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin,
		"github.com/nodevol/nodevol/internal/realnode/pause")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return Image{}, fmt.Errorf("building the pause command: %w\n%s", err, out)
	}
	return Image{Name: PauseImage, Files: []File{{Path: "/pause", Source: bin, Mode: 0o755}}, Entrypoint: []string{"/pause"}}, nil
}

// RegistryDirFiles are img as repository repo, tag tag, laid out below
// dir as agnhost's fake-registry-server serves a registry from a directory
// (test/images/agnhost/fakeregistryserver): the file {repo}/manifests/{tag}
// holds the manifest's digest, and the manifest, config and layer are each
// at {repo}/{manifests or blobs}/sha256/{2 hex digits}/{digest's hex}/data.
// Upstream's agnhost image holds pause:testing so in /var/registry, which
// the image pull specs pull from a registry pod of agnhost.
func RegistryDirFiles(dir, repo, tag string, img Image) ([]File, error) {
	b, err := build(img)
	if err != nil {
		return nil, err
	}
	at := func(kind string, d descriptor) string {
		h := strings.TrimPrefix(d.Digest, "sha256:")
		return path.Join(dir, repo, kind, "sha256", h[:2], h, "data")
	}
	return []File{
		{Path: path.Join(dir, repo, "manifests", tag), Content: []byte(b.manifestDesc.Digest + "\n")},
		{Path: at("manifests", b.manifestDesc), Content: b.manifest},
		{Path: at("blobs", b.configDesc), Content: b.config},
		{Path: at("blobs", b.layerDesc), Content: b.layer},
	}, nil
}

// The media types of an OCI image.
const (
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayer    = "application/vnd.oci.image.layer.v1.tar"
)

// descriptor is an OCI content descriptor.
type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int               `json:"size"`
	Platform    *platform         `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

// built is an image's blobs as WriteArchive and the Registry serve them.
type built struct {
	manifest, config, layer             []byte
	manifestDesc, configDesc, layerDesc descriptor
}

// build makes img's layer, config and manifest. The same image gives the
// same bytes, so the same digests wherever it is served from.
func build(img Image) (built, error) {
	layer, err := layerTar(img.Files)
	if err != nil {
		return built{}, fmt.Errorf("image %s: %w", img.Name, err)
	}
	b := built{layer: layer, layerDesc: blobDesc(mediaLayer, layer)}
	b.config, err = json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"config": map[string]any{
			"Entrypoint": img.Entrypoint,
			"Cmd":        img.Cmd,
			"Env":        append([]string{defaultPath}, img.Env...),
			"User":       img.User,
			"WorkingDir": "/",
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{b.layerDesc.Digest}},
	})
	if err != nil {
		return built{}, err
	}
	b.configDesc = blobDesc(mediaConfig, b.config)
	b.manifest, err = json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaManifest,
		"config":        b.configDesc,
		"layers":        []descriptor{b.layerDesc},
	})
	if err != nil {
		return built{}, err
	}
	b.manifestDesc = blobDesc(mediaManifest, b.manifest)
	return b, nil
}

// WriteArchive writes img as an OCI image layout in a tar archive at
// path, the form `ctr images import` takes; the index names it with
// img.Name (containerd's io.containerd.image.name annotation). The same
// image gives the same bytes.
func WriteArchive(img Image, path string) error {
	b, err := build(img)
	if err != nil {
		return err
	}
	manifestDesc := b.manifestDesc
	manifestDesc.Platform = &platform{Architecture: runtime.GOARCH, OS: "linux"}
	tag := img.Name[strings.LastIndex(img.Name, ":")+1:]
	manifestDesc.Annotations = map[string]string{
		"io.containerd.image.name":          img.Name,
		"org.opencontainers.image.ref.name": tag,
	}
	index, err := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": mediaIndex, "manifests": []descriptor{manifestDesc}})
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	entries := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{blobPath(b.manifestDesc), b.manifest},
		{blobPath(b.configDesc), b.config},
		{blobPath(b.layerDesc), b.layer},
	}
	for _, e := range entries {
		if err := tw.WriteHeader(&tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.data)), ModTime: epoch}); err != nil {
			return err
		}
		if _, err := tw.Write(e.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		return fmt.Errorf("writing image %s: %w", img.Name, err)
	}
	return nil
}

// epoch is every entry's modification time, so that an image's digest
// depends on its content only.
var epoch = time.Unix(0, 0)

func blobDesc(media string, data []byte) descriptor {
	sum := sha256.Sum256(data)
	return descriptor{MediaType: media, Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: len(data)}
}

func blobPath(d descriptor) string { return "blobs/sha256/" + strings.TrimPrefix(d.Digest, "sha256:") }

// layerTar is the layer of files as an uncompressed tar, entries sorted by
// path, parent directories added.
func layerTar(files []File) ([]byte, error) {
	byPath := map[string]File{}
	for _, f := range files {
		p := path.Clean(f.Path)
		if !path.IsAbs(p) || p == "/" {
			return nil, fmt.Errorf("file path %q is not an absolute path below /", f.Path)
		}
		kinds := 0
		for _, set := range []bool{f.Source != "", f.Content != nil, f.Link != "", f.Dir} {
			if set {
				kinds++
			}
		}
		if kinds != 1 {
			return nil, fmt.Errorf("file %s: exactly one of Source, Content, Link and Dir must be set", p)
		}
		if _, dup := byPath[p]; dup {
			return nil, fmt.Errorf("file %s given twice", p)
		}
		f.Path = p
		byPath[p] = f
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if _, ok := byPath[d]; !ok {
				byPath[d] = File{Path: d, Dir: true}
			}
		}
	}
	paths := make([]string, 0, len(byPath))
	for p := range byPath {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		f := byPath[p]
		if f.Dir && f.Mode == 0 {
			f.Mode = 0o755
		}
		hdr := &tar.Header{Name: strings.TrimPrefix(p, "/"), ModTime: epoch, Format: tar.FormatPAX}
		data := f.Content
		switch {
		case f.Dir:
			hdr.Typeflag, hdr.Name = tar.TypeDir, hdr.Name+"/"
		case f.Link != "":
			hdr.Typeflag, hdr.Linkname, f.Mode = tar.TypeSymlink, f.Link, 0o777
		case f.Source != "":
			var err error
			if data, err = os.ReadFile(f.Source); err != nil {
				return nil, fmt.Errorf("file %s: %w", p, err)
			}
			if f.Mode == 0 {
				f.Mode = 0o644
				if st, err := os.Stat(f.Source); err == nil && st.Mode()&0o111 != 0 {
					f.Mode = 0o755
				}
			}
		}
		if !f.Dir && f.Link == "" {
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(data))
			if f.Mode == 0 {
				f.Mode = 0o644
			}
		}
		hdr.Mode = int64(f.Mode)
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
