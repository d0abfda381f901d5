package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/nodevol/nodevol/internal/realnode"
	"github.com/nodevol/nodevol/testenv/internal/noderun"
)

// The images of the suites' CSI drivers, under the names their manifests
// give (test/e2e/testing-manifests/storage-csi, v1.37.2), and the program
// each runs, below the bin directory (make storage-suites-bins) or from
// csi-standins: the four sidecars built from their modules,
// hostpathplugin from Kubernetes' own mock CSI driver, the registrar and
// the liveness probe nodevol's own stand-ins.
var csiImages = []struct{ name, program, source string }{
	{"registry.k8s.io/sig-storage/csi-provisioner:v6.3.0", "csi-provisioner", "csi/csi-provisioner"},
	{"registry.k8s.io/sig-storage/csi-attacher:v4.12.0", "csi-attacher", "csi/csi-attacher"},
	{"registry.k8s.io/sig-storage/csi-resizer:v2.2.0", "csi-resizer", "csi/csi-resizer"},
	{"registry.k8s.io/sig-storage/csi-snapshotter:v8.6.0", "csi-snapshotter", "csi/csi-snapshotter"},
	{hostpathImage, "hostpathplugin", "csi/hostpathplugin"},
	{"registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.17.0", "csi-node-driver-registrar", ""},
	{"registry.k8s.io/sig-storage/livenessprobe:v2.19.0", "livenessprobe", ""},
}

// hostpathImage is the image of csi-driver-host-path's driver, which the
// csi-hostpath driver's manifests and the CSI mock's (as its proxy) run.
const hostpathImage = "registry.k8s.io/sig-storage/hostpathplugin:" + hostpathVersion

// hostpathTools are the programs csi-driver-host-path's driver runs beside
// busybox's (its image installs util-linux): losetup for its block
// volumes (busybox's has no -j), fallocate for their files, mount and
// umount, findmnt for its volume health checks.
var hostpathTools = []string{"losetup", "fallocate", "mount", "umount", "findmnt"}

// mockBusyboxImage is the busybox the CSI mock driver's pod runs beside
// the driver (its embedded specs' file I/O goes through it).
const mockBusyboxImage = "registry.k8s.io/e2e-test-images/busybox:1.36.1-1"

// csiDriverImages builds the CSI drivers' images on busybox's files, each
// program at /{program}, its entrypoint; the stand-ins' program is
// csi-standins (built into work), which plays the part it is named after.
// hostpathPlugin, when set, is csi-driver-host-path's hostpathplugin
// v1.17.1, which the hostpath image then runs, with its tools
// (hostpathTools), in place of conformance/cmd/hostpathplugin (which plays
// the mock driver's part alone).
func csiDriverImages(ctx context.Context, binDir, work string, busybox realnode.Image, hostpathPlugin string) ([]realnode.Image, error) {
	standins := filepath.Join(work, "csi-standins")
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", standins, "github.com/nodevol/nodevol/testenv/cmd/csi-standins")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building csi-standins: %w\n%s", err, out)
	}
	images := []realnode.Image{{Name: mockBusyboxImage, Files: busybox.Files, Cmd: busybox.Cmd}}
	for _, c := range csiImages {
		src := standins
		if c.source != "" {
			src = filepath.Join(binDir, c.source)
		}
		if _, err := os.Stat(src); err != nil {
			return nil, fmt.Errorf("image %s: %w (make storage-suites-bins builds it)", c.name, err)
		}
		var files []realnode.File
		if c.name == hostpathImage && hostpathPlugin != "" {
			if err := checkHostpathVersion(ctx, hostpathPlugin); err != nil {
				return nil, err
			}
			tools, err := noderun.HostPrograms(ctx, hostpathTools...)
			if err != nil {
				return nil, fmt.Errorf("image %s: %w", c.name, err)
			}
			src, files = hostpathPlugin, tools
		}
		// The tools first: a busybox applet at the same path gives way.
		files = noderun.Dedupe(append(append(files, busybox.Files...), realnode.File{Path: "/" + c.program, Source: src, Mode: 0o755}))
		images = append(images, realnode.Image{Name: c.name, Files: files, Entrypoint: []string{"/" + c.program}})
	}
	return images, nil
}

// hostpathVersion is the version of csi-driver-host-path the suite's
// manifests name.
const hostpathVersion = "v1.17.1"

// checkHostpathVersion refuses a hostpathplugin that does not say it is
// hostpathVersion: one built without its version (-X main.version)
// answers GetPluginInfo without one, and every sidecar exits on it.
func checkHostpathVersion(ctx context.Context, bin string) error {
	out, err := exec.CommandContext(ctx, bin, "-version").Output()
	if err != nil {
		return fmt.Errorf("%s -version: %w", bin, err)
	}
	if f := strings.Fields(string(out)); len(f) != 2 || f[1] != hostpathVersion {
		return fmt.Errorf("%s says %q: want csi-driver-host-path's hostpathplugin %s, built with its version", bin, strings.TrimSpace(string(out)), hostpathVersion)
	}
	return nil
}
