package main

import (
	"context"
	"path/filepath"

	"github.com/nodevol/nodevol/testenv/realnode"
)

// agnhostImage is the suite's agnhost (k8s.io/kubernetes
// test/utils/image/manifest.go, v1.37.2), the binary's version.
const agnhostImage = "registry.k8s.io/e2e-test-images/agnhost:2.66.1"

// suiteImages are the images the suite's specs run, built here: busybox
// and the sandbox's pause (package realnode) and agnhost.
func suiteImages(ctx context.Context, binDir, work string) ([]realnode.Image, error) {
	busybox, err := realnode.Busybox(ctx)
	if err != nil {
		return nil, err
	}
	pause, err := realnode.Pause(ctx, work)
	if err != nil {
		return nil, err
	}
	agnhost, err := agnhost(ctx, binDir)
	if err != nil {
		return nil, err
	}
	return []realnode.Image{busybox, pause, agnhost}, nil
}

// agnhost is the agnhost image as upstream's Dockerfile
// (test/images/agnhost/Dockerfile) lays it out, on busybox instead of
// alpine: /agnhost (the binary built by make conformance-bins) and its
// agnhost-2 link, the porter's certificate and key (make conformance-bins
// copies them from the source beside the binary), /uploads, and the user
// and group some specs expect in the image (user-defined-in-image, uid
// 1000, in group-defined-in-image, gid 50000); it runs agnhost pause.
// Alpine's packages (curl, dig, iperf, ...) are not in it: no spec run
// here uses them.
func agnhost(ctx context.Context, binDir string) (realnode.Image, error) {
	files, err := realnode.BusyboxFiles(ctx)
	if err != nil {
		return realnode.Image{}, err
	}
	porter := filepath.Join(binDir, "agnhost-porter")
	for i, f := range files {
		switch f.Path {
		case "/etc/passwd":
			files[i].Content = append(f.Content, "user-defined-in-image:x:1000:1000:Linux User,,,:/home/user-defined-in-image:/bin/sh\n"...)
		case "/etc/group":
			files[i].Content = append(f.Content, "user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n"...)
		}
	}
	files = append(files,
		realnode.File{Path: "/agnhost", Source: filepath.Join(binDir, "agnhost"), Mode: 0o755},
		realnode.File{Path: "/agnhost-2", Link: "agnhost"},
		realnode.File{Path: "/localhost.crt", Source: filepath.Join(porter, "localhost.crt")},
		realnode.File{Path: "/localhost.key", Source: filepath.Join(porter, "localhost.key")},
		realnode.File{Path: "/uploads", Dir: true},
		realnode.File{Path: "/home/user-defined-in-image", Dir: true},
	)
	return realnode.Image{Name: agnhostImage, Files: files, Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}}, nil
}
