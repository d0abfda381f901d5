package volumemanager

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/blockdev"
	"github.com/nodevol/nodevol/internal/ondisk"
)

// TestRestartCallsFollowMountPoints: after a restart on the same boot,
// the CSI calls a filesystem volume still wanted costs depend on which of
// its paths the mount table shows: a completed stage is trusted only if
// the staging path is a mount point, a completed publish only if the pod's
// publish path is. A driver that mounts at both costs nothing; a
// hostpath-style driver whose NodeStage mounts nothing is staged again
// (and not published again while its publish is a mount point); a driver
// that mounts at neither is staged and published again, as the kubelet
// v1.37.2 does for every volume it reconstructs. Both pods of the restart
// env come back, each volume in the same case.
func TestRestartCallsFollowMountPoints(t *testing.T) {
	for _, tc := range []struct {
		name                       string
		stagingMount, publishMount bool
		want                       map[string]int
	}{
		{name: "mounts at both", stagingMount: true, publishMount: true, want: map[string]int{}},
		{name: "hostpath-style: no mount at the staging path", publishMount: true, want: map[string]int{"NodeStageVolume": 2}},
		{name: "no mount at the publish path", stagingMount: true, want: map[string]int{"NodePublishVolume": 2}},
		{name: "mounts at neither", want: map[string]int{"NodeStageVolume": 2, "NodePublishVolume": 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newRestartEnv(t)
			var mps []mount.MountPoint
			for _, v := range []struct{ dir, handle string }{{e.dirA, "handle-a"}, {e.dirB, "handle-b"}} {
				staging, err := ondisk.StagingPath(e.root, e.drv.DriverName(), v.handle)
				if err != nil {
					t.Fatal(err)
				}
				if tc.stagingMount {
					mps = append(mps, mount.MountPoint{Path: staging, Device: "/dev/" + v.handle, Type: "ext4"})
				}
				if tc.publishMount {
					mps = append(mps, mount.MountPoint{Path: filepath.Join(v.dir, "mount"), Device: "/dev/" + v.handle, Type: "ext4"})
				}
			}
			before := e.calls()
			vm, stop := startVMBoot(t, e.client, e.root, e.drv, mount.NewFakeMounter(mps), e.boot)
			defer stop()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for _, p := range []*v1.Pod{e.podA, e.podB} {
				vm.AddPod(p)
			}
			vm.MarkPodsSynced()
			for _, p := range []*v1.Pod{e.podA, e.podB} {
				if err := vm.WaitForAttachAndMount(ctx, p); err != nil {
					t.Fatal(err)
				}
			}
			waitIdle(t, vm)
			if got := e.callsSince(before); !equalCounts(got, tc.want) {
				t.Errorf("CSI calls after the restart = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestBlockRestartRepublishes: a raw block volume is never trusted as
// mapped after a restart, whatever its records say and although its bind
// mount is still in the mount table: the pod added again costs a
// NodeStageVolume and a NodePublishVolume, as in the kubelet v1.37.2, and
// the mapping is made again on the loop device already there.
func TestBlockRestartRepublishes(t *testing.T) {
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
	pvc, pv := csitest.BoundClaim("ns", "raw", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-raw", Block: true})
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{}), pvc, pv)
	root := t.TempDir()
	loops := &countingLooper{fakeLooper: fakeLooper{dev: map[string]string{}}}
	m := mount.NewFakeMounter(nil) // one mount table: the restart keeps the mounts
	mapper := &blockdev.Mapper{Mounter: m, Loop: loops, IsBlockDevice: func(string) (bool, error) { return true, nil }}
	cfg := Config{NodeName: node, KubeClient: client, RootDir: root, Mounter: m, BlockMapper: mapper}
	pod := csitest.Pod("ns", "a", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "raw", Claim: "raw", Block: true}}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	vm, stop := startVMWith(t, cfg, drv)
	vm.AddPod(pod)
	if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, vm)
	stop()
	stage, publish := drv.Calls("NodeStageVolume"), drv.Calls("NodePublishVolume")

	vm, stop = startVMWith(t, cfg, drv)
	defer stop()
	vm.AddPod(pod)
	vm.MarkPodsSynced()
	if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, vm)
	if s, p := drv.Calls("NodeStageVolume")-stage, drv.Calls("NodePublishVolume")-publish; s != 1 || p != 1 {
		t.Errorf("after the restart: %d NodeStageVolume, %d NodePublishVolume; want one each", s, p)
	}
	if u := drv.Calls("NodeUnpublishVolume") + drv.Calls("NodeUnstageVolume"); u != 0 {
		t.Errorf("after the restart: %d unpublish or unstage calls, want none", u)
	}
	if n := loops.attaches.Load(); n != 1 || len(loops.dev) != 1 {
		t.Errorf("loop devices after the restart: %v, attached %d times; want one, attached once", loops.dev, n)
	}
}

// countingLooper is a fakeLooper that counts its attaches.
type countingLooper struct {
	fakeLooper
	attaches atomic.Int32
}

func (c *countingLooper) Attach(ctx context.Context, path string) (string, error) {
	c.attaches.Add(1)
	return c.fakeLooper.Attach(ctx, path)
}
