package driver

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	utilexec "k8s.io/utils/exec"

	"github.com/nodevol/nodevol/internal/roottest"
)

// stageBlock creates a volume and stages it for block access.
func (f *fixture) stageBlock(t *testing.T, name string) (id string, stage *csi.NodeStageVolumeRequest) {
	t.Helper()
	id = f.create(t, name)
	stage = &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: filepath.Join(f.dir, "staging-"+name), VolumeCapability: blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)}
	if _, err := f.node.NodeStageVolume(context.Background(), stage); err != nil {
		t.Fatalf("stage: %v", err)
	}
	return id, stage
}

// A device the kernel detaches only after its last close is gone when
// NodeUnstageVolume succeeds, so that DeleteVolume right after it does
// not find it (the csi-sanity flake: "still attached ... NodeUnstageVolume
// it first").
func TestUnstageWaitsForDeferredDetach(t *testing.T) {
	f := newFixture(t, options{})
	ctx := context.Background()
	f.loop.linger = 3
	id, stage := f.stageBlock(t, "vol")
	if _, err := f.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: stage.StagingTargetPath}); err != nil {
		t.Fatalf("unstage: %v", err)
	}
	if n := f.loop.count(); n != 0 {
		t.Fatalf("after unstage: %d loop devices still attached", n)
	}
	if _, err := f.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatalf("delete right after unstage: %v", err)
	}
}

// A device whose detach does not finish in time: NodeUnstageVolume says
// so with Unavailable and forgets the stage; every call that finds the
// device waits for it and never uses it again; a retry finishes once the
// device is gone.
func TestUnstageDetachStillPending(t *testing.T) {
	const wait = 30 * time.Millisecond
	f := newFixture(t, options{DetachTimeout: wait})
	ctx := context.Background()
	f.loop.linger = -1
	id, stage := f.stageBlock(t, "vol")
	unstage := &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: stage.StagingTargetPath}

	start := time.Now()
	_, err := f.node.NodeUnstageVolume(ctx, unstage)
	wantCode(t, "unstage, device still open", err, codes.Unavailable)
	if d := time.Since(start); d < wait {
		t.Errorf("unstage gave up after %v, before the %v detach timeout", d, wait)
	}
	if n := f.loop.count(); n != 1 {
		t.Fatalf("%d devices attached, want the one being detached", n)
	}

	// Not staged any more: publishing would hand out a device on its way out.
	target := filepath.Join(f.dir, "pod", "dev")
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		t.Fatal(err)
	}
	_, err = f.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: stage.StagingTargetPath, TargetPath: target, VolumeCapability: stage.VolumeCapability})
	wantCode(t, "publish after a failed unstage", err, codes.FailedPrecondition)
	// Retriable, not FailedPrecondition: the device is only being detached.
	_, err = f.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
	wantCode(t, "delete while the detach is pending", err, codes.Unavailable)
	_, err = f.node.NodeStageVolume(ctx, stage)
	wantCode(t, "stage while the detach is pending", err, codes.Unavailable)
	_, err = f.node.NodeUnstageVolume(ctx, unstage)
	wantCode(t, "unstage again while the detach is pending", err, codes.Unavailable)

	// The RPC's deadline bounds the wait too.
	f.serve(t, options{NodeID: "node-1", StateDir: filepath.Join(f.dir, "state"), Loop: f.loop, Mounter: f.mounter, DetachTimeout: time.Hour})
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	start = time.Now()
	_, err = f.node.NodeUnstageVolume(short, unstage)
	if err == nil {
		t.Fatal("unstage with a short deadline succeeded while the detach is pending")
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("unstage with a 50ms deadline took %v", d)
	}

	f.loop.release()
	if _, err := f.node.NodeUnstageVolume(ctx, unstage); err != nil {
		t.Fatalf("unstage once the device is gone: %v", err)
	}
	if _, err := f.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatalf("delete once the device is gone: %v", err)
	}
}

// NodeStageVolume does not reuse a device being detached: it waits for it
// to go and attaches the image anew.
func TestStageSkipsDetachingDevice(t *testing.T) {
	f := newFixture(t, options{})
	ctx := context.Background()
	id, stage := f.stageBlock(t, "vol")
	f.loop.linger = 2
	// A crash after the detach, before the state was written: the volume
	// is still recorded as staged on a device being detached.
	var old string
	for _, devs := range f.loop.attached {
		old = devs[0]
	}
	if err := f.loop.Detach(ctx, old); err != nil {
		t.Fatal(err)
	}
	if _, err := f.node.NodeStageVolume(ctx, stage); err != nil {
		t.Fatalf("stage again: %v", err)
	}
	var now []string
	for _, devs := range f.loop.attached {
		now = append(now, devs...)
	}
	if len(now) != 1 || now[0] == old {
		t.Fatalf("after staging again: devices %v, want one new device, not %s", now, old)
	}
	if _, err := f.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: stage.StagingTargetPath}); err != nil {
		t.Fatal(err)
	}
}

// losetup's Detaching sees what the kernel does: detaching a loop device
// that is open elsewhere succeeds but only marks it, and it stays
// attached until the last close.
func TestLosetupDeferredDetach(t *testing.T) {
	roottest.Require(t)
	if _, err := exec.LookPath("losetup"); err != nil {
		t.Skip("losetup not installed")
	}
	ctx := context.Background()
	image := filepath.Join(t.TempDir(), "img")
	if err := os.WriteFile(image, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(image, 1<<20); err != nil {
		t.Fatal(err)
	}
	l := losetup{exec: utilexec.New()}
	dev, err := l.Attach(ctx, image)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Detach(ctx, dev) })
	if p, err := l.Detaching(ctx, dev); err != nil || p {
		t.Fatalf("Detaching(%s) just attached = %v, %v; want false", dev, p, err)
	}
	holder, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Detach(ctx, dev); err != nil {
		_ = holder.Close()
		t.Fatalf("detach while open elsewhere: %v", err)
	}
	devs, err := l.Find(ctx, image)
	if err != nil || !slices.Contains(devs, dev) {
		t.Errorf("Find after a detach while open elsewhere = %v, %v; want %s still there", devs, err, dev)
	}
	if p, err := l.Detaching(ctx, dev); err != nil || !p {
		t.Errorf("Detaching(%s) while open elsewhere = %v, %v; want true", dev, p, err)
	}
	if err := holder.Close(); err != nil {
		t.Fatal(err)
	}
	if devs, err := l.Find(ctx, image); err != nil || slices.Contains(devs, dev) {
		t.Errorf("Find after the last close = %v, %v; want %s gone", devs, err, dev)
	}
	if p, err := l.Detaching(ctx, dev); err != nil || p {
		t.Errorf("Detaching(%s) after the last close = %v, %v; want false", dev, p, err)
	}
}
