package volumemanager

// The workloads of docs/PERFORMANCE.md, over the public API, with the test
// kit's in-process driver (which does nothing but keep state) on a real
// unix socket, the fake clientset and the benchmarks' fake mounter
// (internal/mapmount, the kubelet's side's too):
//
//	W1, W2  BenchmarkMountPods       mount N pods with a PVC each, then unmount until unstaged
//	        BenchmarkMountPodsClusterInformers  the same with Config.ClusterInformers (informers, no GETs)
//	W3      BenchmarkIdle            10,000 mounted volumes left alone for a minute
//	W4      BenchmarkSharedVolume    100 pods sharing one RWX PVC
//	W5      BenchmarkAttachRequired  attach required, VolumeAttachments attached after 5 ms
//	W6      BenchmarkRealPods        W1 and W2 with real pods (bench_realpods_test.go)
//	floor   BenchmarkDriverOnly      NodeStage + NodePublish straight to the same driver
//
// NODEVOL_BENCH_CPUPROFILE=name profiles each phase apart (phaseProfile).

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/bench/realpods"
	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/mapmount"
)

// workload is one benchmark scenario.
type workload struct {
	pods   int
	shared bool          // every pod uses one RWX claim (W4)
	attach time.Duration // attach required; the fake attacher's delay (W5)
	idle   time.Duration // time to stay mounted before unmounting (W3)
	real   bool          // W6: each pod's volumes as a real pod has them (realPodObjects)
	maxOps int           // Config.MaxConcurrentOperations; 0: the default
	// informers: Config.ClusterInformers, every claim, volume and
	// attachment listed and watched; otherwise (the default) claims and
	// volumes are read by name as a node under the Node authorizer does.
	informers bool
}

// result is what one run of a workload measured.
type result struct {
	mount, unmount, idle       time.Duration
	mountCPU, unmountCPU       time.Duration
	idleCPU                    time.Duration
	dials                      int64
	rpcs, apiRequests, volumes int
	peakHeap, mountAllocs      uint64
	heapInuse, peakRSS         uint64 // after mount (HeapInuse after a GC); VmHWM of the run
	// heapHarness: HeapInuse after a GC once the harness is made (the fake
	// API server and its objects, the pods, the driver), before the volume
	// manager; heapStart: before the first pod, the volume manager running
	// (its informers synced).
	heapHarness, heapStart uint64
	// baseRSS, baseAnonRSS: VmRSS and its anonymous part (all but the
	// binary, which is file-backed or, built on a tmpfs, shmem) before the
	// first pod, where peakRSS starts from.
	baseRSS, baseAnonRSS uint64
	// apiByKind counts every request to the API server during the mount,
	// the informers' lists and watches included, by "verb resource".
	apiByKind map[string]int
}

// cpuTime is the process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// heapSampler tracks the peak live heap while it runs.
type heapSampler struct {
	stop chan struct{}
	done chan uint64
}

func sampleHeap() *heapSampler {
	h := &heapSampler{stop: make(chan struct{}), done: make(chan uint64)}
	go func() {
		var peak uint64
		var ms runtime.MemStats
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapAlloc)
			select {
			case <-h.stop:
				h.done <- peak
				return
			case <-t.C:
			}
		}
	}()
	return h
}

func (h *heapSampler) peak() uint64 { close(h.stop); return <-h.done }

// apiRequests counts the clientset's requests other than the informers'
// list and watch, and other than the simulated controllers' writes to
// VolumeAttachments: the requests nodevol itself makes.
func apiRequests(client *fake.Clientset) int {
	n := 0
	for _, a := range client.Actions() {
		switch {
		case a.GetVerb() == "list" || a.GetVerb() == "watch":
		case a.GetResource().Resource == "volumeattachments":
		default:
			n++
		}
	}
	return n
}

// workloadObjects makes the API objects and the pods of w, with the PVs
// its pods' claims are bound to.
func workloadObjects(w workload, driver string) ([]kruntime.Object, []*v1.Pod, []*v1.PersistentVolume) {
	if w.real {
		return realpods.Objects(w.pods, node, driver)
	}
	objs := []kruntime.Object{csitest.CSIDriver(driver, csitest.CSIDriverSpec{AttachRequired: w.attach > 0})}
	pods := make([]*v1.Pod, w.pods)
	var pvs []*v1.PersistentVolume
	for i := range pods {
		name := fmt.Sprintf("claim-%d", i)
		if w.shared {
			name = "shared"
		}
		if i == 0 || !w.shared {
			pvc, pv := csitest.BoundClaim("ns", name, csitest.PVSpec{
				Driver:      driver,
				Handle:      "handle-" + name,
				AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteMany},
			})
			objs = append(objs, pvc, pv)
			pvs = append(pvs, pv)
		}
		pods[i] = csitest.Pod("ns", fmt.Sprintf("pod-%d", i), csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: name}}})
	}
	return objs, pods, pvs
}

func runWorkload(b *testing.B, w workload) result {
	b.StopTimer()
	drv := csitest.New(b, csitest.Options{NoRecord: true, CreateTargetDirs: true})
	objs, pods, pvs := workloadObjects(w, drv.DriverName())
	// The simple tracker, as on the kubelet's side of bench-compare: the
	// field-managed one of NewClientset builds a REST mapper per write,
	// which would be most of W5's CPU and none of nodevol's.
	client := fake.NewSimpleClientset(objs...) //nolint:staticcheck // see above
	if w.real {
		// Before the informers use the client: its reactor chain is not
		// safe to change while in use.
		client.PrependReactor("create", "serviceaccounts", issueBenchToken)
		realpods.ServeByName(client)
	}
	if w.attach > 0 {
		csitest.NewFakeAttacher(b, client, csitest.AttacherOptions{Delay: w.attach})
	}
	var r result
	r.heapHarness = heapInuseNow()
	vm, err := New(Config{NodeName: node, KubeClient: client, RootDir: b.TempDir(), Mounter: mapmount.New(),
		MaxConcurrentOperations: w.maxOps, ClusterInformers: w.informers})
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
	<-vm.ready
	waitCtx, waitCancel := context.WithTimeout(ctx, 10*time.Minute)
	defer waitCancel()
	r.heapStart = heapInuseNow()
	if err := resetPeakRSS(); err != nil {
		b.Fatal(err)
	}
	r.volumes = len(pvs)
	if r.baseRSS, err = procStatus("VmRSS"); err != nil {
		b.Fatal(err)
	}
	if r.baseAnonRSS, err = procStatus("RssAnon"); err != nil {
		b.Fatal(err)
	}
	apiBefore, rpcsBefore, dialsBefore := apiRequests(client), drv.Calls(""), drv.Connections()
	actionsBefore := len(client.Actions())
	heap := sampleHeap()
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)

	stopProfile := phaseProfile(b, "mount")
	b.StartTimer()
	start, cpu := time.Now(), cpuTime()
	if w.attach > 0 {
		// The attach/detach controller's part: a VolumeAttachment per PV,
		// all at once, as the kubelet's side of bench-compare does.
		for _, pv := range pvs {
			go func() {
				if _, err := csitest.AttachVolume(ctx, client, pv, node); err != nil && ctx.Err() == nil {
					b.Error(err)
				}
			}()
		}
	}
	for _, p := range pods {
		vm.AddPod(p)
	}
	for _, p := range pods {
		if err := vm.WaitForAttachAndMount(waitCtx, p); err != nil {
			b.Fatal(err)
		}
	}
	r.mount, r.mountCPU = time.Since(start), cpuTime()-cpu
	b.StopTimer()
	stopProfile()
	runtime.ReadMemStats(&ms1)
	r.mountAllocs = ms1.Mallocs - ms0.Mallocs
	r.rpcs = drv.Calls("") - rpcsBefore
	r.dials = int64(drv.Connections() - dialsBefore)
	r.apiRequests = apiRequests(client) - apiBefore
	r.apiByKind = realpods.CountActions(client.Actions()[actionsBefore:])
	r.heapInuse = heapInuseAfterGC(b, fmt.Sprintf("pods=%d", w.pods))

	if w.idle > 0 {
		start, cpu = time.Now(), cpuTime()
		time.Sleep(w.idle)
		r.idle, r.idleCPU = time.Since(start), cpuTime()-cpu
	}

	stopProfile = phaseProfile(b, "unmount")
	b.StartTimer()
	start, cpu = time.Now(), cpuTime()
	for _, p := range pods {
		vm.DeletePod(p)
	}
	for _, p := range pods {
		if err := vm.WaitForUnmount(waitCtx, p); err != nil {
			b.Fatal(err)
		}
	}
	// Woken by each call rather than listing the driver's volumes every
	// millisecond: at 5,000 volumes that listing (sorted) was 7% of the
	// unmount's CPU, the harness's and not nodevol's (the kubelet's side
	// polls a counter).
	if err := drv.WaitForCalls(waitCtx, "NodeUnstageVolume", len(pvs)); err != nil {
		b.Fatal(err)
	}
	for len(drv.StagedVolumes()) > 0 || len(knownVolumes(vm)) > 0 {
		select {
		case <-waitCtx.Done():
			b.Fatal("volumes not unstaged")
		case <-time.After(time.Millisecond):
		}
	}
	r.unmount, r.unmountCPU = time.Since(start), cpuTime()-cpu
	b.StopTimer()
	stopProfile()
	r.peakHeap = heap.peak()
	if r.peakRSS, err = peakRSS(); err != nil {
		b.Fatal(err)
	}
	if got := drv.Calls("NodeStageVolume"); got != len(pvs) {
		b.Fatalf("NodeStageVolume calls = %d, want %d", got, len(pvs))
	}
	return r
}

// report runs w b.N times and reports the averages.
func report(b *testing.B, w workload) {
	var sum result
	for i := 0; i < b.N; i++ {
		r := runWorkload(b, w)
		sum.mount += r.mount
		sum.unmount += r.unmount
		sum.mountCPU += r.mountCPU
		sum.unmountCPU += r.unmountCPU
		sum.idleCPU += r.idleCPU
		sum.idle += r.idle
		sum.dials += r.dials
		sum.rpcs += r.rpcs
		sum.apiRequests += r.apiRequests
		sum.volumes += r.volumes
		sum.peakHeap = max(sum.peakHeap, r.peakHeap)
		sum.mountAllocs += r.mountAllocs
		sum.heapInuse = max(sum.heapInuse, r.heapInuse)
		sum.heapHarness = max(sum.heapHarness, r.heapHarness)
		sum.heapStart = max(sum.heapStart, r.heapStart)
		sum.peakRSS = max(sum.peakRSS, r.peakRSS)
		sum.baseRSS = max(sum.baseRSS, r.baseRSS)
		sum.baseAnonRSS = max(sum.baseAnonRSS, r.baseAnonRSS)
		sum.apiByKind = realpods.AddCounts(sum.apiByKind, r.apiByKind)
	}
	n := float64(b.N)
	b.ReportMetric(sum.mount.Seconds()/n, "mount-s")
	b.ReportMetric(sum.mountCPU.Seconds()/n, "mount-cpu-s")
	b.ReportMetric(sum.unmount.Seconds()/n, "unmount-s")
	b.ReportMetric(sum.unmountCPU.Seconds()/n, "unmount-cpu-s")
	if w.idle > 0 {
		b.ReportMetric(sum.idleCPU.Seconds()/n, "idle-cpu-s")
	}
	b.ReportMetric(float64(sum.mount.Microseconds())/(n*float64(w.pods)), "µs-mount/pod")
	b.ReportMetric(float64(sum.unmount.Microseconds())/(n*float64(w.pods)), "µs-unmount/pod")
	b.ReportMetric(float64(sum.dials)/float64(sum.volumes), "dials/vol")
	b.ReportMetric(float64(sum.rpcs)/float64(sum.volumes), "rpcs/vol")
	b.ReportMetric(float64(sum.apiRequests)/float64(sum.volumes), "api/vol")
	b.ReportMetric(float64(sum.mountAllocs)/(n*float64(w.pods)), "allocs/pod")
	b.ReportMetric(float64(sum.peakHeap)/(1<<20), "peak-heap-MiB")
	b.ReportMetric(float64(sum.heapInuse)/(1<<20), "heap-inuse-MiB")
	b.ReportMetric(float64(sum.heapHarness)/(1<<20), "heap-inuse-harness-MiB")
	b.ReportMetric(float64(sum.heapStart)/(1<<20), "heap-inuse-start-MiB")
	b.ReportMetric(float64(sum.peakRSS)/(1<<20), "peak-rss-MiB")
	b.ReportMetric(float64(sum.baseRSS)/(1<<20), "base-rss-MiB")
	b.ReportMetric(float64(sum.baseAnonRSS)/(1<<20), "base-rss-anon-MiB")
	if w.real {
		realpods.ReportByKind(b, sum.apiByKind, n*float64(w.pods))
	}
	b.ReportMetric(0, "ns/op")
}

// benchSizes returns the pod counts to run, NODEVOL_BENCH_PODS (comma
// separated) overriding the default.
func benchSizes(def ...int) []int { return benchSizesFrom("NODEVOL_BENCH_PODS", def...) }

// benchSizesFrom returns the pod counts in environment variable name
// (comma separated), or def when it is unset.
func benchSizesFrom(name string, def ...int) []int {
	env := os.Getenv(name)
	if env == "" {
		return def
	}
	var out []int
	for _, f := range strings.Split(env, ",") {
		if n, err := strconv.Atoi(f); err == nil && n > 0 {
			out = append(out, n)
		}
	}
	return out
}

// BenchmarkMountPods is W1 and W2: N pods with one PVC each mounted, then
// all unmounted and unstaged.
func BenchmarkMountPods(b *testing.B) {
	for _, n := range benchSizes(10, 100, 1000, 5000) {
		b.Run(fmt.Sprintf("pods=%d", n), func(b *testing.B) { report(b, workload{pods: n}) })
	}
}

// BenchmarkMountPodsClusterInformers is W1 and W2 with
// Config.ClusterInformers: nodevol lists and watches every claim, volume
// and attachment of the cluster instead of reading each pod's claim and
// volume by name (GET) and caching what its pods use, as the kubelet does
// and as BenchmarkMountPods (the default) does. make bench-compare sets it
// beside the kubelet's BenchmarkMountPods too.
func BenchmarkMountPodsClusterInformers(b *testing.B) {
	for _, n := range benchSizes(10, 100, 1000, 5000) {
		b.Run(fmt.Sprintf("pods=%d", n), func(b *testing.B) { report(b, workload{pods: n, informers: true}) })
	}
}

// BenchmarkIdle is W3: 10,000 mounted volumes left alone for a minute
// (idle-cpu-s: the CPU the whole process used meanwhile).
func BenchmarkIdle(b *testing.B) {
	n := 10000
	if v, err := strconv.Atoi(os.Getenv("NODEVOL_BENCH_IDLE_VOLUMES")); err == nil && v > 0 {
		n = v
	}
	b.Run(fmt.Sprintf("volumes=%d", n), func(b *testing.B) { report(b, workload{pods: n, idle: time.Minute}) })
}

// BenchmarkSharedVolume is W4: 100 pods sharing one RWX PVC.
func BenchmarkSharedVolume(b *testing.B) {
	b.Run("pods=100", func(b *testing.B) { report(b, workload{pods: 100, shared: true}) })
}

// BenchmarkAttachRequired is W5: attach required; the fake attacher marks
// each VolumeAttachment attached 5 ms after it appears.
func BenchmarkAttachRequired(b *testing.B) {
	for _, n := range []int{100} { // the fake clientset's watchers overflow with the kubelet's watch per VolumeAttachment beyond this
		b.Run(fmt.Sprintf("pods=%d", n), func(b *testing.B) { report(b, workload{pods: n, attach: 5 * time.Millisecond}) })
	}
}

// BenchmarkDriverOnly is the floor: NodeStageVolume + NodePublishVolume for
// N volumes, then NodeUnpublishVolume + NodeUnstageVolume, issued straight
// to the same in-process driver over one connection, as many at a time as
// nodevol's default MaxConcurrentOperations (64 on up to 2 CPUs).
func BenchmarkDriverOnly(b *testing.B) {
	for _, n := range benchSizes(10, 100, 1000, 5000) {
		b.Run(fmt.Sprintf("volumes=%d", n), func(b *testing.B) {
			var mountT, unmountT, mountCPU, unmountCPU time.Duration
			for i := 0; i < b.N; i++ {
				m, u, mc, uc := driverOnly(b, n, defaultMaxConcurrentOperations())
				mountT += m
				unmountT += u
				mountCPU += mc
				unmountCPU += uc
			}
			nn := float64(b.N)
			b.ReportMetric(mountT.Seconds()/nn, "mount-s")
			b.ReportMetric(mountCPU.Seconds()/nn, "mount-cpu-s")
			b.ReportMetric(unmountT.Seconds()/nn, "unmount-s")
			b.ReportMetric(unmountCPU.Seconds()/nn, "unmount-cpu-s")
			b.ReportMetric(float64(mountT.Microseconds())/(nn*float64(n)), "µs-mount/pod")
			b.ReportMetric(float64(unmountT.Microseconds())/(nn*float64(n)), "µs-unmount/pod")
			b.ReportMetric(0, "ns/op")
		})
	}
}

func driverOnly(b *testing.B, n, concurrency int) (mountT, unmountT, mountCPU, unmountCPU time.Duration) {
	b.StopTimer()
	drv := csitest.New(b, csitest.Options{NoRecord: true, CreateTargetDirs: true})
	conn, err := grpc.NewClient("unix://"+drv.Endpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	node := csi.NewNodeClient(conn)
	dir := b.TempDir()
	capability := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	ctx := context.Background()
	each := func(f func(i int) error) {
		var wg sync.WaitGroup
		next := make(chan int)
		for w := 0; w < concurrency; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					if err := f(i); err != nil {
						b.Error(err)
					}
				}
			}()
		}
		for i := 0; i < n; i++ {
			next <- i
		}
		close(next)
		wg.Wait()
	}
	paths := func(i int) (string, string, string) {
		id := "vol-" + strconv.Itoa(i)
		return id, fmt.Sprintf("%s/stage/%d", dir, i), fmt.Sprintf("%s/pods/%d/mount", dir, i)
	}
	stopProfile := phaseProfile(b, "floor-mount")
	b.StartTimer()
	start, cpu := time.Now(), cpuTime()
	each(func(i int) error {
		id, staging, target := paths(i)
		if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: capability}); err != nil {
			return err
		}
		_, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: capability})
		return err
	})
	mountT, mountCPU = time.Since(start), cpuTime()-cpu
	stopProfile()
	stopProfile = phaseProfile(b, "floor-unmount")
	start, cpu = time.Now(), cpuTime()
	each(func(i int) error {
		id, staging, target := paths(i)
		if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
			return err
		}
		_, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
		return err
	})
	unmountT, unmountCPU = time.Since(start), cpuTime()-cpu
	b.StopTimer()
	stopProfile()
	return mountT, unmountT, mountCPU, unmountCPU
}

// BenchmarkColdStart is the time from Run to the first pod mounted: the
// informers start and list, the disk is read, the pod (added before Run,
// as an agent restarting with its pod list does) is resolved and mounted.
// The driver is registered before Run.
func BenchmarkColdStart(b *testing.B) {
	drv := csitest.New(b, csitest.Options{NoRecord: true, CreateTargetDirs: true})
	var total time.Duration
	for i := 0; b.Loop(); i++ {
		claim := fmt.Sprintf("claim-%d", i) // the driver keeps what it staged
		pvc, pv := csitest.BoundClaim("ns", claim, csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-" + claim})
		pod := csitest.Pod("ns", "pod", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: claim}}})
		client := fake.NewSimpleClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{}), pvc, pv) //nolint:staticcheck // as runWorkload
		vm, err := New(Config{NodeName: node, KubeClient: client, RootDir: b.TempDir(), Mounter: mount.NewFakeMounter(nil)})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		if err := vm.Drivers().Register(ctx, drv.DriverName(), drv.Endpoint()); err != nil {
			b.Fatal(err)
		}
		vm.AddPod(pod)
		done := make(chan error)
		start := time.Now()
		go func() { done <- vm.Run(ctx) }()
		if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
			b.Fatal(err)
		}
		total += time.Since(start)
		cancel()
		<-done
		vm.Drivers().Deregister(drv.DriverName())
	}
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms-first-mount")
	b.ReportMetric(0, "ns/op")
}
