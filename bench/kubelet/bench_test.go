// Package kubeletbench runs nodevol's benchmark workloads on the kubelet's
// volume manager (k8s.io/kubernetes v1.37.2), with its real CSI plugin,
// the fake clientset, the benchmarks' fake mounter (internal/mapmount,
// nodevol's side's too) and an in-process CSI driver that does nothing,
// and reports the same metrics under the same names, so that make
// bench-compare can set the two side by side.
package kubeletbench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodevol/nodevol/bench/realpods"
	"github.com/nodevol/nodevol/internal/mapmount"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/volumemanager"
	"k8s.io/kubernetes/pkg/volume/csi"
	volumetest "k8s.io/kubernetes/pkg/volume/testing"
	"k8s.io/kubernetes/pkg/volume/util/hostutil"
)

const node = "node-1"

// runs numbers the runs: each registers its driver under its own name, as
// the kubelet's CSI driver store is global and keeps registrations.
var runs int

type podManager struct {
	mu   sync.Mutex
	pods map[types.UID]*v1.Pod
	// register, when set, is told each pod added (true) and removed, as
	// the kubelet tells its secret and configMap managers (W6).
	register func(p *v1.Pod, present bool)
}

func (m *podManager) GetPodByUID(uid types.UID) (*v1.Pod, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.pods[uid]
	return p, ok
}

func (m *podManager) GetPods() []*v1.Pod {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*v1.Pod, 0, len(m.pods))
	for _, p := range m.pods {
		out = append(out, p)
	}
	return out
}

func (m *podManager) set(p *v1.Pod, present bool) {
	if m.register != nil && present {
		m.register(p, true) // before the volume manager sees the pod, as the kubelet's SyncPod
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if present {
		m.pods[p.UID] = p
	} else {
		delete(m.pods, p.UID)
		if m.register != nil {
			m.register(p, false)
		}
	}
}

// podState says that pods no longer in the pod manager have terminated.
type podState struct{ pods *podManager }

func (s podState) ShouldPodContainersBeTerminating(uid types.UID) bool {
	_, ok := s.pods.GetPodByUID(uid)
	return !ok
}

func (s podState) ShouldPodRuntimeBeRemoved(uid types.UID) bool {
	_, ok := s.pods.GetPodByUID(uid)
	return !ok
}

// volumeHealth stands for the kubelet's status manager, which the volume
// manager tells the pods' volume health conditions. It does so only with
// the CSIVolumeHealth feature, alpha and off by default in 1.37 as here:
// nothing is reported, nothing would read it.
type volumeHealth struct{}

func (volumeHealth) SetPodVolumeHealth(klog.Logger, types.UID, string, []v1.VolumeHealthCondition) bool {
	return false
}

// volumeHealthPeriod is the kubelet's volume health probe interval, its
// volumeStatsAggPeriod by default (unused with CSIVolumeHealth off).
const volumeHealthPeriod = time.Minute

type sourcesReady struct{}

func (sourcesReady) AddSource(string) {}
func (sourcesReady) AllReady() bool   { return true }

type workload struct {
	pods   int
	shared bool
	attach time.Duration
	idle   time.Duration
	real   bool // W6 (bench_realpods_test.go)
}

type result struct {
	mount, unmount, mountCPU, unmountCPU, idleCPU time.Duration
	dials, rpcs, apiRequests, volumes             int
	peakHeap, mountAllocs                         uint64
	heapInuse, peakRSS                            uint64 // after mount (HeapInuse after a GC); VmHWM of the run
	// heapHarness: HeapInuse after a GC once the harness is made (the fake
	// API server and its objects, the pods, the driver), before the volume
	// plugins and the volume manager; heapStart: before the first pod, the
	// volume manager running.
	heapHarness, heapStart uint64
	// apiByKind counts every request to the API server during the mount,
	// the informers' and managers' lists and watches included, by "verb
	// resource".
	apiByKind map[string]int
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func sampleHeap(stop <-chan struct{}) <-chan uint64 {
	done := make(chan uint64, 1)
	go func() {
		var peak uint64
		var ms runtime.MemStats
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapAlloc)
			select {
			case <-stop:
				done <- peak
				return
			case <-t.C:
			}
		}
	}()
	return done
}

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

func objects(w workload, driverName string) ([]kruntime.Object, []*v1.Pod, []*v1.PersistentVolume) {
	if w.real {
		return realpods.Objects(w.pods, node, driverName)
	}
	attach := w.attach > 0
	no := false
	fsGroupPolicy := storagev1.ReadWriteOnceWithFSTypeFSGroupPolicy
	nodeObj := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
	objs := []kruntime.Object{
		// With the defaults the API server would set.
		&storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: driverName}, Spec: storagev1.CSIDriverSpec{
			AttachRequired: &attach, PodInfoOnMount: &no, RequiresRepublish: &no, StorageCapacity: &no, SELinuxMount: &no,
			FSGroupPolicy: &fsGroupPolicy, VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent},
		}},
	}
	var pods []*v1.Pod
	var pvs []*v1.PersistentVolume
	fs := v1.PersistentVolumeFilesystem
	for i := 0; i < w.pods; i++ {
		claim := fmt.Sprintf("claim-%d", i)
		if w.shared {
			claim = "shared"
		}
		if i == 0 || !w.shared {
			pvName := "pv-" + claim
			pv := &v1.PersistentVolume{
				ObjectMeta: metav1.ObjectMeta{Name: pvName},
				Spec: v1.PersistentVolumeSpec{
					Capacity:                      v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")},
					AccessModes:                   []v1.PersistentVolumeAccessMode{v1.ReadWriteMany},
					PersistentVolumeSource:        v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: driverName, VolumeHandle: "handle-" + claim}},
					ClaimRef:                      &v1.ObjectReference{Namespace: "ns", Name: claim, UID: types.UID("uid-" + claim)},
					VolumeMode:                    &fs,
					PersistentVolumeReclaimPolicy: v1.PersistentVolumeReclaimDelete,
				},
				Status: v1.PersistentVolumeStatus{Phase: v1.VolumeBound},
			}
			pvc := &v1.PersistentVolumeClaim{
				ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: claim, UID: types.UID("uid-" + claim)},
				Spec:       v1.PersistentVolumeClaimSpec{VolumeName: pvName, AccessModes: pv.Spec.AccessModes, VolumeMode: &fs},
				Status:     v1.PersistentVolumeClaimStatus{Phase: v1.ClaimBound, Capacity: pv.Spec.Capacity},
			}
			objs = append(objs, pv, pvc)
			pvs = append(pvs, pv)
			if attach {
				nodeObj.Status.VolumesAttached = append(nodeObj.Status.VolumesAttached, v1.AttachedVolume{
					Name: v1.UniqueVolumeName("kubernetes.io/csi/" + driverName + "^handle-" + claim), DevicePath: "",
				})
			}
		}
		name := fmt.Sprintf("pod-%d", i)
		pods = append(pods, &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)},
			Spec: v1.PodSpec{
				NodeName:   node,
				Volumes:    []v1.Volume{{Name: "data", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}},
				Containers: []v1.Container{{Name: "c", Image: "busybox", VolumeMounts: []v1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			},
			Status: v1.PodStatus{Phase: v1.PodRunning},
		})
	}
	return append(objs, nodeObj), pods, pvs
}

// attacher plays the attach/detach controller and the external-attacher:
// a VolumeAttachment per PV, attached after delay.
func attacher(ctx context.Context, client *fake.Clientset, pvs []*v1.PersistentVolume, driverName string, delay time.Duration) {
	for _, pv := range pvs {
		go func() {
			sum := sha256.Sum256([]byte(pv.Spec.CSI.VolumeHandle + driverName + node))
			name := "csi-" + hex.EncodeToString(sum[:])
			va := &storagev1.VolumeAttachment{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: storagev1.VolumeAttachmentSpec{Attacher: driverName, NodeName: node,
					Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv.Name}},
			}
			created, err := client.StorageV1().VolumeAttachments().Create(ctx, va, metav1.CreateOptions{})
			if err != nil {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(delay):
			}
			created.Status.Attached = true
			_, _ = client.StorageV1().VolumeAttachments().UpdateStatus(ctx, created, metav1.UpdateOptions{})
		}()
	}
}

func runWorkload(b *testing.B, w workload) result {
	b.StopTimer()
	root, err := os.MkdirTemp("", "kb-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(root)
	runs++
	driverName := fmt.Sprintf("bench%d.csi.nodevol.io", runs)
	drv, err := startDriver(filepath.Join(root, "csi.sock"), driverName)
	if err != nil {
		b.Fatal(err)
	}
	defer drv.stop()
	objs, pods, pvs := objects(w, driverName)
	client := fake.NewSimpleClientset(objs...)
	if w.real {
		client.PrependReactor("create", "serviceaccounts", (&tokenIssuer{}).react)
		realpods.ServeByName(client)
	}
	var nodeObj *v1.Node
	for _, o := range objs {
		if n, ok := o.(*v1.Node); ok {
			nodeObj = n
		}
	}
	var r result
	r.heapHarness = heapInuseNow()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pm := &podManager{pods: map[types.UID]*v1.Pod{}}
	mounter := mapmount.New()
	plugins, err := workloadPlugins(ctx, w, root, client, nodeObj, pm, mounter)
	if err != nil {
		b.Fatal(err)
	}
	if err := csi.PluginHandler.RegisterPlugin(ctx, driverName, filepath.Join(root, "csi.sock"), []string{"1.0.0"}, nil); err != nil {
		b.Fatal(err)
	}
	vm := volumemanager.NewVolumeManager(true, node, pm, podState{pm}, client, plugins,
		mounter, hostutil.NewFakeHostUtil(nil), filepath.Join(root, "pods"),
		&record.FakeRecorder{}, volumetest.NewBlockVolumePathHandler(), volumeHealth{}, volumeHealthPeriod)
	go vm.Run(ctx, sourcesReady{})
	if w.attach > 0 {
		// The node status loop's part (every 10 s in a kubelet; 100 ms here).
		go func() {
			t := time.NewTicker(100 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					vm.MarkVolumesAsReportedInUse(vm.GetVolumesInUse())
				}
			}
		}()
	}
	waitCtx, waitCancel := context.WithTimeout(ctx, 10*time.Minute)
	defer waitCancel()
	r.heapStart = heapInuseNow()
	if err := resetPeakRSS(); err != nil {
		b.Fatal(err)
	}
	r.volumes = len(pvs)
	apiBefore, rpcsBefore, dialsBefore := apiRequests(client), drv.calls.Load(), drv.accepted.Load()
	actionsBefore := len(client.Actions())
	stopHeap := make(chan struct{})
	peak := sampleHeap(stopHeap)
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)

	b.StartTimer()
	start, cpu := time.Now(), cpuTime()
	if w.attach > 0 {
		attacher(ctx, client, pvs, driverName, w.attach)
	}
	for _, p := range pods {
		pm.set(p, true)
	}
	for _, p := range pods {
		if err := vm.WaitForAttachAndMount(waitCtx, p); err != nil {
			b.Fatal(err)
		}
	}
	r.mount, r.mountCPU = time.Since(start), cpuTime()-cpu
	b.StopTimer()
	runtime.ReadMemStats(&ms1)
	r.mountAllocs = ms1.Mallocs - ms0.Mallocs
	r.rpcs = int(drv.calls.Load() - rpcsBefore)
	r.dials = int(drv.accepted.Load() - dialsBefore)
	r.apiRequests = apiRequests(client) - apiBefore
	r.apiByKind = realpods.CountActions(client.Actions()[actionsBefore:])
	r.heapInuse = heapInuseAfterGC(b, fmt.Sprintf("pods=%d", w.pods))

	if w.idle > 0 {
		cpu = cpuTime()
		time.Sleep(w.idle)
		r.idleCPU = cpuTime() - cpu
	}

	b.StartTimer()
	start, cpu = time.Now(), cpuTime()
	for _, p := range pods {
		pm.set(p, false)
	}
	for _, p := range pods {
		if err := vm.WaitForUnmount(waitCtx, p); err != nil {
			b.Fatal(err)
		}
	}
	for drv.stagedCount() > 0 {
		select {
		case <-waitCtx.Done():
			b.Fatal("volumes not unstaged")
		case <-time.After(time.Millisecond):
		}
	}
	r.unmount, r.unmountCPU = time.Since(start), cpuTime()-cpu
	b.StopTimer()
	close(stopHeap)
	r.peakHeap = <-peak
	if r.peakRSS, err = peakRSS(); err != nil {
		b.Fatal(err)
	}
	return r
}

func report(b *testing.B, w workload) {
	var sum result
	for i := 0; i < b.N; i++ {
		r := runWorkload(b, w)
		sum.mount += r.mount
		sum.unmount += r.unmount
		sum.mountCPU += r.mountCPU
		sum.unmountCPU += r.unmountCPU
		sum.idleCPU += r.idleCPU
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
	if w.real {
		realpods.ReportByKind(b, sum.apiByKind, n*float64(w.pods))
	}
	b.ReportMetric(0, "ns/op")
}

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

func BenchmarkMountPods(b *testing.B) {
	for _, n := range benchSizes(10, 100, 1000, 5000) {
		b.Run(fmt.Sprintf("pods=%d", n), func(b *testing.B) { report(b, workload{pods: n}) })
	}
}

func BenchmarkIdle(b *testing.B) {
	n := 10000
	if v, err := strconv.Atoi(os.Getenv("NODEVOL_BENCH_IDLE_VOLUMES")); err == nil && v > 0 {
		n = v
	}
	b.Run(fmt.Sprintf("volumes=%d", n), func(b *testing.B) { report(b, workload{pods: n, idle: time.Minute}) })
}

func BenchmarkSharedVolume(b *testing.B) {
	b.Run("pods=100", func(b *testing.B) { report(b, workload{pods: 100, shared: true}) })
}

func BenchmarkAttachRequired(b *testing.B) {
	for _, n := range []int{100} { // the fake clientset's watchers overflow with the kubelet's watch per VolumeAttachment beyond this
		b.Run(fmt.Sprintf("pods=%d", n), func(b *testing.B) { report(b, workload{pods: n, attach: 5 * time.Millisecond}) })
	}
}
