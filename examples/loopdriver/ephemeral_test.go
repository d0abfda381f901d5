package main

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/examples/loopdriver/driver"
	"github.com/nodevol/nodevol/internal/roottest"
)

// inlineID is a volume ID as the kubelet makes one for an inline volume.
const inlineID = "csi-0f9e8d7c6b5a49382716051f2e3d4c5b6a798897a6b5c4d3e2f1a0b9c8d7e6f5"

// inlinePublish is the kubelet's NodePublishVolume of an inline ephemeral
// volume of 32Mi, with podInfoOnMount.
func inlinePublish(target string) *csi.NodePublishVolumeRequest {
	return &csi.NodePublishVolumeRequest{VolumeId: inlineID, TargetPath: target, VolumeCapability: &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}, VolumeContext: map[string]string{
		driver.SizeAttribute:               "32Mi",
		"csi.storage.k8s.io/ephemeral":     "true",
		"csi.storage.k8s.io/pod.name":      "p",
		"csi.storage.k8s.io/pod.namespace": "ns",
		"csi.storage.k8s.io/pod.uid":       "uid-p",
	}}
}

// mountID is the mount ID of the mount at path in /proc/self/mountinfo,
// "" if none.
func mountID(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	id := ""
	for line := range strings.Lines(string(data)) {
		if f := strings.Fields(line); len(f) > 4 && f[4] == path {
			id = f[0]
		}
	}
	return id
}

// TestEphemeralRestartAndCrash runs an inline ephemeral volume's life on
// real loop devices and ext4, with the driver stopped, or killed in the
// middle of a call, between the calls: a repeated publish keeps the mount
// (the same mount ID) and the data, also after a restart; a publish
// interrupted after the mount is finished by its retry; an unpublish
// interrupted after the unmount is finished by its retry; and unpublish
// leaves no mount, loop device, image or state file, and may be repeated.
func TestEphemeralRestartAndCrash(t *testing.T) {
	roottest.Require(t)
	dir := csitest.SocketDir(t)
	sock, state := filepath.Join(dir, "csi.sock"), filepath.Join(dir, "state")
	target := filepath.Join(dir, "pods", "uid-p", "volumes", "kubernetes.io~csi", "eph", "mount")
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pub, unpub := inlinePublish(target), &csi.NodeUnpublishVolumeRequest{VolumeId: inlineID, TargetPath: target}
	start := func(faults ...string) (*driverProc, csi.NodeClient) {
		p := startDriver(t, sock, state, faults...)
		return p, csi.NewNodeClient(dial(t, sock))
	}
	crash := func(what string, err error, p *driverProc) {
		t.Helper()
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("%s with an exit fault: %v, want Unavailable (driver gone)", what, err)
		}
		if code := p.waitExit(t, 10*time.Second); code != 3 {
			t.Fatalf("driver exit code %d, want 3 (injected exit)", code)
		}
	}

	p, node := start("--fault=NodePublishVolume:exit")
	_, err := node.NodePublishVolume(ctx, pub)
	crash("NodePublishVolume", err, p)
	p, node = start()
	if _, err := node.NodePublishVolume(ctx, pub); err != nil {
		t.Fatalf("NodePublishVolume after a crash in it: %v", err)
	}
	if devs := loopDevicesUnder(t, dir); len(devs) != 1 {
		t.Fatalf("loop devices %v, want the one attached before the crash", devs)
	}
	id := mountID(t, target)
	if err := os.WriteFile(filepath.Join(target, "data"), []byte("kept"), 0o600); err != nil {
		t.Fatal(err)
	}
	p.stop(t)
	p, node = start()
	if _, err := node.NodePublishVolume(ctx, pub); err != nil {
		t.Fatalf("NodePublishVolume after a restart: %v", err)
	}
	if got := mountID(t, target); got != id || id == "" {
		t.Errorf("mount ID after a repeated publish: %q, want %q", got, id)
	}
	if b, err := os.ReadFile(filepath.Join(target, "data")); err != nil || string(b) != "kept" {
		t.Errorf("data after a restart: %q, %v", b, err)
	}
	if _, err := node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: inlineID, VolumePath: target}); err != nil {
		t.Errorf("NodeGetVolumeStats after a restart: %v", err)
	}
	p.stop(t)

	p, node = start("--fault=NodeUnpublishVolume:exit")
	_, err = node.NodeUnpublishVolume(ctx, unpub)
	crash("NodeUnpublishVolume", err, p)
	_, node = start()
	for i := range 2 {
		if _, err := node.NodeUnpublishVolume(ctx, unpub); err != nil {
			t.Fatalf("NodeUnpublishVolume #%d after a crash in it: %v", i, err)
		}
	}
	for _, path := range []string{target, filepath.Join(state, "volumes", inlineID+".img"), filepath.Join(state, "volumes", inlineID+".json")} {
		if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s after unpublish: %v, want gone", path, err)
		}
	}
	checkNoLeaks(t, dir)
}
