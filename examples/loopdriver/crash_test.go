package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/roottest"
)

var fsCap = &csi.VolumeCapability{
	AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

// TestCrashMidStage kills the driver in the middle of NodeStageVolume,
// after it attached the loop device and before it formatted, mounted or
// recorded anything, then restarts it on the same state directory: the
// retried stage must reuse the device, the data must survive a second
// stage, and unstage must leave no loop device behind.
func TestCrashMidStage(t *testing.T) {
	roottest.Require(t)
	dir := csitest.SocketDir(t)
	sock, state := filepath.Join(dir, "csi.sock"), filepath.Join(dir, "state")
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "target")
	if err := os.Mkdir(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	drv := startDriver(t, sock, state, "--fault=NodeStageVolume:exit")
	conn := dial(t, sock)
	ctrl, node := csi.NewControllerClient(conn), csi.NewNodeClient(conn)
	vol, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:               "crash-vol",
		VolumeCapabilities: []*csi.VolumeCapability{fsCap},
		CapacityRange:      &csi.CapacityRange{RequiredBytes: 64 << 20},
	})
	if err != nil {
		t.Fatalf("CreateVolume: %v", err)
	}
	id := vol.GetVolume().GetVolumeId()
	stage := &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: fsCap}
	if _, err := node.NodeStageVolume(ctx, stage); status.Code(err) != codes.Unavailable {
		t.Fatalf("NodeStageVolume with exit fault: got %v, want Unavailable (driver gone)", err)
	}
	if code := drv.waitExit(t, 10*time.Second); code != 3 {
		t.Fatalf("driver exit code %d, want 3 (injected exit)", code)
	}
	if devs := loopDevicesUnder(t, dir); len(devs) != 1 {
		t.Fatalf("after the crash: loop devices %v, want the one attached before the crash", devs)
	}

	startDriver(t, sock, state)
	conn = dial(t, sock)
	node = csi.NewNodeClient(conn)
	if _, err := node.NodeStageVolume(ctx, stage); err != nil {
		t.Fatalf("NodeStageVolume after restart: %v", err)
	}
	if devs := loopDevicesUnder(t, dir); len(devs) != 1 {
		t.Fatalf("after restaging: loop devices %v, want exactly one (reused)", devs)
	}
	pub := &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: fsCap}
	if _, err := node.NodePublishVolume(ctx, pub); err != nil {
		t.Fatalf("NodePublishVolume: %v", err)
	}
	if err := os.WriteFile(filepath.Join(target, "data"), []byte("kept"), 0o600); err != nil {
		t.Fatalf("writing to the volume: %v", err)
	}
	unpub := &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}
	unstage := &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}
	for _, step := range []func() error{
		func() error { _, err := node.NodeUnpublishVolume(ctx, unpub); return err },
		func() error { _, err := node.NodeUnstageVolume(ctx, unstage); return err },
		// Staging again must find the file system and keep the data.
		func() error { _, err := node.NodeStageVolume(ctx, stage); return err },
		func() error { _, err := node.NodePublishVolume(ctx, pub); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(target, "data")); err != nil || string(b) != "kept" {
		t.Fatalf("data after restage: %q, %v; want \"kept\"", b, err)
	}
	if _, err := node.NodeUnpublishVolume(ctx, unpub); err != nil {
		t.Fatal(err)
	}
	if _, err := node.NodeUnstageVolume(ctx, unstage); err != nil {
		t.Fatal(err)
	}
	// Idempotent: a second unstage is success and changes nothing.
	if _, err := node.NodeUnstageVolume(ctx, unstage); err != nil {
		t.Fatalf("second NodeUnstageVolume: %v", err)
	}
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Errorf("target path still exists after unpublish: %v", err)
	}
	if _, err := csi.NewControllerClient(conn).DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatalf("DeleteVolume: %v", err)
	}
	checkNoLeaks(t, dir)
}
