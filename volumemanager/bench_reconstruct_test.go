package volumemanager

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/podvol"
)

// BenchmarkReconstruct is a restart at scale: N volumes (10,000, or
// NODEVOL_BENCH_RECONSTRUCT_VOLUMES) staged and published by a first run,
// one pod each, found on disk by a second volume manager whose mount table
// (the fake mounter's) lists every staging and publish path. Timed: New,
// Run, the driver registered, the disk read and every volume held in the
// actual state, then every pod added again and waited for until mounted.
// Each volume is verified from nodevol's record and the mount table, so
// none needs a CSI call: the benchmark fails if the second run makes one.
//
//	reconstruct-s     New to every volume held (Run's disk read)
//	restart-s         New to every re-added pod mounted
//	restart-cpu-s     the CPU the whole process used meanwhile
func BenchmarkReconstruct(b *testing.B) {
	n := 10000
	if v, err := strconv.Atoi(os.Getenv("NODEVOL_BENCH_RECONSTRUCT_VOLUMES")); err == nil && v > 0 {
		n = v
	}
	b.Run(fmt.Sprintf("volumes=%d", n), func(b *testing.B) {
		var held, total, cpu time.Duration
		for range b.N {
			h, t, c := reconstructOnce(b, n)
			held += h
			total += t
			cpu += c
		}
		nn := float64(b.N)
		b.ReportMetric(held.Seconds()/nn, "reconstruct-s")
		b.ReportMetric(total.Seconds()/nn, "restart-s")
		b.ReportMetric(cpu.Seconds()/nn, "restart-cpu-s")
		b.ReportMetric(0, "ns/op")
	})
}

// reconstructOnce mounts n pods with a first volume manager, stops it, and
// times a second one on the same root until it holds every volume (held)
// and every pod added again is mounted (total).
func reconstructOnce(b *testing.B, n int) (held, total, cpu time.Duration) {
	b.StopTimer()
	drv := csitest.New(b, csitest.Options{NoRecord: true, CreateTargetDirs: true})
	objs := []kruntime.Object{csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{})}
	pods := make([]*v1.Pod, n)
	pvs := make([]*v1.PersistentVolume, n)
	for i := range pods {
		name := fmt.Sprintf("claim-%d", i)
		pvc, pv := csitest.BoundClaim("ns", name, csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-" + name})
		objs = append(objs, pvc, pv)
		pvs[i] = pv
		pods[i] = csitest.Pod("ns", fmt.Sprintf("pod-%d", i), csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: name}}})
	}
	client := fake.NewSimpleClientset(objs...) //nolint:staticcheck // as runWorkload
	root := b.TempDir()

	// The first run: every pod mounted, then stopped with its volumes in place.
	vm1, err := New(Config{NodeName: node, KubeClient: client, RootDir: root, Mounter: mount.NewFakeMounter(nil)})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	stop1 := runInBackground(ctx, vm1)
	if err := vm1.Drivers().Register(ctx, drv.DriverName(), drv.Endpoint()); err != nil {
		b.Fatal(err)
	}
	for _, p := range pods {
		vm1.AddPod(p)
	}
	for _, p := range pods {
		if err := vm1.WaitForAttachAndMount(ctx, p); err != nil {
			b.Fatal(err)
		}
	}
	stop1()

	// The mount table after the restart: the in-process driver mounts
	// nothing, so the fake mounter is told what a real driver would have
	// left mounted.
	mps := make([]mount.MountPoint, 0, 2*n)
	for i, p := range pods {
		staging, err := ondisk.StagingDir(root, drv.DriverName(), pvs[i].Spec.CSI.VolumeHandle)
		if err != nil {
			b.Fatal(err)
		}
		dir, err := ondisk.PodVolumeDir(root, p.UID, pvs[i].Name)
		if err != nil {
			b.Fatal(err)
		}
		mps = append(mps,
			mount.MountPoint{Device: "/dev/fake", Path: staging + "/globalmount", Type: "ext4"},
			mount.MountPoint{Device: staging + "/globalmount", Path: dir + "/mount", Type: "ext4", Opts: []string{"bind"}})
	}
	calls := drv.Calls("NodeStageVolume") + drv.Calls("NodePublishVolume") + drv.Calls("NodeUnpublishVolume") + drv.Calls("NodeUnstageVolume")

	b.StartTimer()
	start, cpu0 := time.Now(), cpuTime()
	vm2, err := New(Config{NodeName: node, KubeClient: client, RootDir: root, Mounter: mount.NewFakeMounter(mps)})
	if err != nil {
		b.Fatal(err)
	}
	stop2 := runInBackground(ctx, vm2)
	defer stop2()
	if err := vm2.Drivers().Register(ctx, drv.DriverName(), drv.Endpoint()); err != nil {
		b.Fatal(err)
	}
	select {
	case <-vm2.ready: // the informers synced and the disk read: the actual state holds what was found
	case <-ctx.Done():
		b.Fatal(ctx.Err())
	}
	held = time.Since(start)
	for _, p := range pods {
		vm2.AddPod(p)
	}
	for _, p := range pods {
		if err := vm2.WaitForAttachAndMount(ctx, p); err != nil {
			b.Fatal(err)
		}
	}
	total, cpu = time.Since(start), cpuTime()-cpu0
	b.StopTimer()

	if got := len(vm2.asw.VolumeNames()); got != n {
		b.Fatalf("volumes held after the restart = %d, want %d", got, n)
	}
	for _, p := range pods {
		if vols := vm2.GetMountedVolumesForPod(p.UID); len(vols) != 1 || vols[0].State != podvol.Mounted {
			b.Fatalf("pod %s's volumes after the restart = %+v, want one Mounted", p.Name, vols)
		}
	}
	if got := drv.Calls("NodeStageVolume") + drv.Calls("NodePublishVolume") + drv.Calls("NodeUnpublishVolume") + drv.Calls("NodeUnstageVolume"); got != calls {
		b.Fatalf("the restart made %d CSI volume calls, want none: every volume is verified from its record and the mount table", got-calls)
	}
	return held, total, cpu
}

// runInBackground runs vm until the returned function is called, which
// stops it and waits for Run to return.
func runInBackground(ctx context.Context, vm *VolumeManager) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- vm.Run(ctx) }()
	return func() { cancel(); <-done }
}
