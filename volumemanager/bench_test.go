package volumemanager

import (
	"context"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// BenchmarkMountPods measures, through the public API, the time from AddPod
// to mounted for N pods with one PVC each (in-process driver, fake mounter),
// and then the time until they are all unmounted and unstaged.
func BenchmarkMountPods(b *testing.B) {
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprintf("pods=%d", n), func(b *testing.B) {
			var mountTotal, unmountTotal time.Duration
			var dials int64
			for i := 0; i < b.N; i++ {
				m, u, d := mountPods(b, n)
				mountTotal += m
				unmountTotal += u
				dials += d
			}
			b.ReportMetric(float64(mountTotal.Microseconds())/float64(b.N*n), "µs-mount/pod")
			b.ReportMetric(float64(unmountTotal.Microseconds())/float64(b.N*n), "µs-unmount/pod")
			b.ReportMetric(float64(dials)/float64(b.N), "dials/run")
			b.ReportMetric(0, "ns/op")
		})
	}
}

func mountPods(b *testing.B, n int) (mountTime, unmountTime time.Duration, dials int64) {
	b.StopTimer()
	drv := csitest.New(b, csitest.Options{NoRecord: true, CreateTargetDirs: true})
	objs := []runtime.Object{csitest.CSIDriver(drv.DriverName(), false)}
	pods := make([]*v1.Pod, n)
	for i := range pods {
		name := fmt.Sprintf("claim-%d", i)
		pvc, pv := csitest.BoundClaim("ns", name, drv.DriverName(), "handle-"+name)
		objs = append(objs, pvc, pv)
		pods[i] = csitest.Pod("ns", fmt.Sprintf("pod-%d", i), csitest.WithPVC("data", name, false))
	}
	vm, err := New(Config{NodeName: node, KubeClient: fake.NewClientset(objs...), RootDir: b.TempDir(), Mounter: mount.NewFakeMounter(nil)})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- vm.Run(ctx) }()
	defer func() { cancel(); <-done }()
	if err := vm.Drivers().Register(ctx, drv.DriverName(), drv.Endpoint()); err != nil {
		b.Fatal(err)
	}
	waitCtx, waitCancel := context.WithTimeout(ctx, 5*time.Minute)
	defer waitCancel()

	b.StartTimer()
	start := time.Now()
	for _, p := range pods {
		vm.AddPod(p)
	}
	for _, p := range pods {
		if err := vm.WaitForAttachAndMount(waitCtx, p); err != nil {
			b.Fatal(err)
		}
	}
	mountTime = time.Since(start)
	start = time.Now()
	for _, p := range pods {
		vm.DeletePod(p)
	}
	for _, p := range pods {
		if err := vm.WaitForUnmount(waitCtx, p); err != nil {
			b.Fatal(err)
		}
	}
	for len(drv.StagedVolumes()) > 0 || len(vm.GetVolumesInUse()) > 0 {
		select {
		case <-waitCtx.Done():
			b.Fatal("volumes not unstaged")
		case <-time.After(time.Millisecond):
		}
	}
	unmountTime = time.Since(start)
	b.StopTimer()
	if got := drv.Calls("NodeStageVolume"); got != n {
		b.Fatalf("NodeStageVolume calls = %d, want %d", got, n)
	}
	return mountTime, unmountTime, vm.Drivers().Dials()
}
