package noderun

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"

	"github.com/nodevol/nodevol/internal/realnode"
)

// Upstream's test images built here (k8s.io/kubernetes
// test/utils/image/manifest.go, v1.37.2).
const (
	AgnhostImage      = "registry.k8s.io/e2e-test-images/agnhost:2.66.1"
	AgnhostPrevImage  = "registry.k8s.io/e2e-test-images/agnhost:2.55"
	NonRootImage      = "registry.k8s.io/e2e-test-images/nonroot:1.5"
	NonewprivsImage   = "registry.k8s.io/e2e-test-images/nonewprivs:1.4"
	KittenImage       = "registry.k8s.io/e2e-test-images/kitten:1.8"
	NautilusImage     = "registry.k8s.io/e2e-test-images/nautilus:1.8"
	NginxImage        = "registry.k8s.io/e2e-test-images/nginx:1.27.0-2"
	GlibcDNSImage     = "registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1"
	DevicePluginImage = "registry.k8s.io/e2e-test-images/sample-device-plugin:1.8.0"
)

// SuiteImages are the images the suites' specs run, built here from what
// make conformance-bins put in binDir: busybox (built with busybox's
// default configuration, as upstream's image has it), the sandbox's pause
// (package realnode), agnhost and the images made from it or from busybox
// as upstream's Dockerfiles make them (test/images/*/Dockerfile), on
// busybox instead of alpine or Debian.
func SuiteImages(ctx context.Context, binDir, work string) ([]realnode.Image, error) {
	busybox, err := realnode.Busybox(ctx, filepath.Join(binDir, "busybox"))
	if err != nil {
		return nil, err
	}
	pause, err := realnode.Pause(ctx, work)
	if err != nil {
		return nil, err
	}
	base := busybox.Files
	files := filepath.Join(binDir, "image-files")
	agnhost, err := agnhostFiles(ctx, base, binDir, pause)
	if err != nil {
		return nil, err
	}
	with := func(img realnode.Image, name string, more ...realnode.File) realnode.Image {
		img.Name = name
		img.Files = append(append([]realnode.File(nil), img.Files...), more...)
		return img
	}
	nginx, err := nginxFiles(ctx, base, binDir)
	if err != nil {
		return nil, err
	}
	glibcDNS, err := glibcDNSFiles(ctx, base)
	if err != nil {
		return nil, err
	}
	return []realnode.Image{
		busybox, pause, agnhost, nginx, glibcDNS,
		// The previous agnhost, which specs use as a second image (an image
		// update): the same binary, told apart by a file of its own.
		with(agnhost, AgnhostPrevImage, realnode.File{Path: "/VERSION", Content: []byte("2.55 (built here: the 2.66.1 binary)\n")}),
		{Name: NonRootImage, Files: base, Cmd: []string{"sh"}, User: "1234"},
		{Name: NonewprivsImage, Files: append(append([]realnode.File(nil), base...),
			realnode.File{Path: "/usr/local/bin/nnp", Source: filepath.Join(files, "nnp"), Mode: 0o4755}), Cmd: []string{"nnp"}},
		withCmd(with(agnhost, KittenImage,
			realnode.File{Path: "/kitten.jpg", Source: filepath.Join(files, "kitten", "kitten.jpg")},
			realnode.File{Path: "/data.json", Source: filepath.Join(files, "kitten", "data.json")}), "test-webserver"),
		withCmd(with(agnhost, NautilusImage,
			realnode.File{Path: "/nautilus.jpg", Source: filepath.Join(files, "nautilus", "nautilus.jpg")},
			realnode.File{Path: "/data.json", Source: filepath.Join(files, "nautilus", "data.json")}), "test-webserver"),
		// The device plugin specs' plugin (test/images/sample-device-plugin,
		// on busybox instead of alpine).
		{Name: DevicePluginImage, Files: append(append([]realnode.File(nil), base...),
			realnode.File{Path: "/sampledeviceplugin", Source: filepath.Join(binDir, "sample-device-plugin"), Mode: 0o755}),
			Entrypoint: []string{"/sampledeviceplugin", "-alsologtostderr"}},
	}, nil
}

func withCmd(img realnode.Image, cmd ...string) realnode.Image {
	img.Cmd = cmd
	return img
}

// agnhostFiles is the agnhost image as upstream's Dockerfile lays it out
// (test/images/agnhost/Dockerfile), on busybox instead of alpine: /agnhost
// (built by make conformance-bins) and its agnhost-2 link, the porter's
// certificate and key, /uploads, and the user and group some specs expect
// in the image (user-defined-in-image, uid 1000, in
// group-defined-in-image, gid 50000), and the pause image as pause:testing
// in /var/registry, the directory agnhost's fake-registry-server serves
// (upstream's image has it there; the image pull specs run a registry pod
// of agnhost and pull that image from it); it runs agnhost pause. Of Alpine's
// packages it has curl and bash, Debian's, with their libraries (the
// lifecycle hook and networking specs run curl in it), and not the others
// (dig, iperf, socat, ...).
func agnhostFiles(ctx context.Context, base []realnode.File, binDir string, pause realnode.Image) (realnode.Image, error) {
	files := append([]realnode.File(nil), base...)
	for i, f := range files {
		switch f.Path {
		case "/etc/passwd":
			files[i].Content = append(append([]byte(nil), f.Content...), "user-defined-in-image:x:1000:1000:Linux User,,,:/home/user-defined-in-image:/bin/sh\n"...)
		case "/etc/group":
			files[i].Content = append(append([]byte(nil), f.Content...), "user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n"...)
		}
	}
	extra := filepath.Join(binDir, "image-files")
	files = append(files,
		realnode.File{Path: "/agnhost", Source: filepath.Join(binDir, "agnhost"), Mode: 0o755},
		realnode.File{Path: "/agnhost-2", Link: "agnhost"},
		realnode.File{Path: "/localhost.crt", Source: filepath.Join(extra, "localhost.crt")},
		realnode.File{Path: "/localhost.key", Source: filepath.Join(extra, "localhost.key")},
		realnode.File{Path: "/uploads", Dir: true},
		realnode.File{Path: "/home/user-defined-in-image", Dir: true},
	)
	registry, err := realnode.RegistryDirFiles("/var/registry", "pause", "testing", pause)
	if err != nil {
		return realnode.Image{}, err
	}
	files = append(files, registry...)
	for _, p := range []struct{ name, path string }{{"curl", "/usr/bin/curl"}, {"bash", "/bin/bash"}} {
		more, err := hostProgram(ctx, p.name, p.path)
		if err != nil {
			return realnode.Image{}, err
		}
		files = append(files, more...)
	}
	return realnode.Image{Name: AgnhostImage, Files: Dedupe(files), Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}}, nil
}

// nginxConf serves /usr/share/nginx/html on port 80, as upstream's nginx
// image does, with its logs on the container's output and every path the
// Debian build names by default below directories the image has.
const nginxConf = `user nobody nobody;
worker_processes 1;
error_log stderr;
pid /run/nginx.pid;
events {}
http {
  access_log /dev/stdout;
  client_body_temp_path /var/lib/nginx/body;
  server {
    listen 80;
    root /usr/share/nginx/html;
  }
}
`

// nginxFiles is the nginx image: Debian's nginx (make conformance-bins
// takes it from the package, uninstalled) with its libraries, on busybox,
// serving a page on port 80 in the foreground as upstream's image does.
// The suite's specs run it as a long-running container (static and mirror
// pods, an image update) and read nothing of nginx's own.
func nginxFiles(ctx context.Context, base []realnode.File, binDir string) (realnode.Image, error) {
	bin, err := realnode.HostProgram(ctx, filepath.Join(binDir, "nginx"), "/usr/sbin/nginx")
	if err != nil {
		return realnode.Image{}, err
	}
	files := append(append([]realnode.File(nil), base...), bin...)
	files = append(files,
		realnode.File{Path: "/etc/nginx/nginx.conf", Content: []byte(nginxConf)},
		realnode.File{Path: "/usr/share/nginx/html/index.html", Content: []byte("<html><body>nginx, built for node-conformance</body></html>\n")},
		realnode.File{Path: "/var/log/nginx", Dir: true},
		realnode.File{Path: "/var/lib/nginx", Dir: true},
		realnode.File{Path: "/run", Dir: true},
	)
	return realnode.Image{Name: NginxImage, Files: Dedupe(files), Cmd: []string{"nginx", "-g", "daemon off;"}}, nil
}

// glibcDNSFiles is the glibc-dns-testing image, in which specs run
// hostname and hostname -f to read a pod's FQDN through glibc's resolver:
// upstream's is Debian with dnsutils; this one is busybox with Debian's
// hostname (glibc's, in busybox's place) and the name service switch
// Debian's images have (hosts from /etc/hosts first). dig is not in it.
func glibcDNSFiles(ctx context.Context, base []realnode.File) (realnode.Image, error) {
	files, err := hostProgram(ctx, "hostname", "/bin/hostname")
	if err != nil {
		return realnode.Image{}, err
	}
	files = append(files, realnode.File{Path: "/etc/nsswitch.conf", Content: []byte("passwd: files\ngroup: files\nhosts: files dns\n")})
	return realnode.Image{Name: GlibcDNSImage, Files: Dedupe(append(files, base...)), Cmd: []string{"sh"}}, nil
}

// hostProgram is the files of this machine's program name at path in an
// image ("": where it is here), with its libraries (realnode.HostProgram).
func hostProgram(ctx context.Context, name, path string) ([]realnode.File, error) {
	bin, err := exec.LookPath(name)
	if err != nil {
		return nil, fmt.Errorf("%s for the images (make deps installs it): %w", name, err)
	}
	if path == "" {
		path = bin
	}
	return realnode.HostProgram(ctx, bin, path)
}

// HostPrograms is the files of this machine's programs names (found in
// its PATH), each at its path here, with the libraries they load, each
// once: the tools a program in an image runs (upstream's image installs
// them from its distribution's packages).
func HostPrograms(ctx context.Context, names ...string) ([]realnode.File, error) {
	var files []realnode.File
	for _, name := range names {
		f, err := hostProgram(ctx, name, "")
		if err != nil {
			return nil, err
		}
		files = append(files, f...)
	}
	return Dedupe(files), nil
}

// Dedupe keeps the first file of each path: libraries two host programs
// share are in an image once.
func Dedupe(files []realnode.File) []realnode.File {
	have := make(map[string]bool, len(files))
	out := files[:0:0]
	for _, f := range files {
		if !have[f.Path] {
			have[f.Path] = true
			out = append(out, f)
		}
	}
	return out
}
