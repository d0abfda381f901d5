package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// BenchmarkStagePublish measures NodeStageVolume + NodePublishVolume of a
// 64 MiB ext4 volume and the reverse, over gRPC on the driver's unix
// socket, and reports the mean time of each RPC. The file system is made
// in the first stage, before the timer starts, so the loop measures the
// steady state: attach, fsck-free mount, bind mount, and back.
func BenchmarkStagePublish(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("BenchmarkStagePublish needs root (loop devices and mounts)")
	}
	dir := csitest.SocketDir(b)
	sock := filepath.Join(dir, "csi.sock")
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "target")
	if err := os.Mkdir(staging, 0o750); err != nil {
		b.Fatal(err)
	}
	startDriver(b, sock, filepath.Join(dir, "state"))
	conn := dial(b, sock)
	ctrl, node := csi.NewControllerClient(conn), csi.NewNodeClient(conn)
	ctx := context.Background()
	vol, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:               "bench",
		VolumeCapabilities: []*csi.VolumeCapability{fsCap},
		CapacityRange:      &csi.CapacityRange{RequiredBytes: 64 << 20},
	})
	if err != nil {
		b.Fatal(err)
	}
	id := vol.GetVolume().GetVolumeId()
	stage := &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: fsCap}
	pub := &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: fsCap}
	unpub := &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}
	unstage := &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}
	if _, err := node.NodeStageVolume(ctx, stage); err != nil {
		b.Fatal(err)
	}
	if _, err := node.NodeUnstageVolume(ctx, unstage); err != nil {
		b.Fatal(err)
	}

	var tStage, tPub, tUnpub, tUnstage time.Duration
	timed := func(d *time.Duration, call func() error) {
		start := time.Now()
		if err := call(); err != nil {
			b.Fatal(err)
		}
		*d += time.Since(start)
	}
	b.ResetTimer()
	for b.Loop() {
		timed(&tStage, func() error { _, err := node.NodeStageVolume(ctx, stage); return err })
		timed(&tPub, func() error { _, err := node.NodePublishVolume(ctx, pub); return err })
		timed(&tUnpub, func() error { _, err := node.NodeUnpublishVolume(ctx, unpub); return err })
		timed(&tUnstage, func() error { _, err := node.NodeUnstageVolume(ctx, unstage); return err })
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(float64(tStage.Microseconds())/n/1000, "ms/stage")
	b.ReportMetric(float64(tPub.Microseconds())/n/1000, "ms/publish")
	b.ReportMetric(float64(tUnpub.Microseconds())/n/1000, "ms/unpublish")
	b.ReportMetric(float64(tUnstage.Microseconds())/n/1000, "ms/unstage")
	if _, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		b.Fatal(err)
	}
	checkNoLeaks(b, dir)
}
