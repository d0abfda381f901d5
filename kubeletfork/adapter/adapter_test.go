package adapter

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/volumemanager"
	volumetypes "k8s.io/kubernetes/pkg/volume/util/types"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/podvol"
	nvm "github.com/nodevol/nodevol/volumemanager"
)

const node = "node-1"

// kubeletPods stands in for the kubelet's pod manager and pod workers:
// the pods it holds, and which of them are terminating or gone.
type kubeletPods struct {
	mu          sync.Mutex
	pods        map[types.UID]*v1.Pod
	terminating map[types.UID]bool
	removable   map[types.UID]bool
}

func newKubeletPods(pods ...*v1.Pod) *kubeletPods {
	k := &kubeletPods{pods: map[types.UID]*v1.Pod{}, terminating: map[types.UID]bool{}, removable: map[types.UID]bool{}}
	for _, p := range pods {
		k.pods[p.UID] = p
	}
	return k
}

func (k *kubeletPods) GetPodByUID(uid types.UID) (*v1.Pod, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	p, ok := k.pods[uid]
	return p, ok
}

func (k *kubeletPods) GetPods() []*v1.Pod {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]*v1.Pod, 0, len(k.pods))
	for _, p := range k.pods {
		out = append(out, p)
	}
	return out
}

func (k *kubeletPods) ShouldPodContainersBeTerminating(uid types.UID) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.terminating[uid] || k.removable[uid]
}

func (k *kubeletPods) ShouldPodRuntimeBeRemoved(uid types.UID) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.removable[uid]
}

// terminate marks the pod's containers stopped, as the pod workers do
// when its termination has finished; gone also drops it from the pod
// manager (the pod was deleted from the API).
func (k *kubeletPods) terminate(uid types.UID, gone bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.removable[uid] = true
	if gone {
		delete(k.pods, uid)
	}
}

// TestKubeletInterface drives nodevol through the kubelet's VolumeManager
// interface as the kubelet does: a CSI driver registered through the
// plugin handler, a pod with a claim and an emptyDir waited for by its
// sync, its volumes read for the containers' mounts and stats, then its
// termination and the wait for its unmount.
func TestKubeletInterface(t *testing.T) {
	drv := csitest.New(t, csitest.Options{GetVolumeStats: true})
	pvc, pv := csitest.BoundClaim("ns", "data", csitest.PVSpec{Driver: drv.DriverName(), Handle: "vol-1"})
	pod := csitest.Pod("ns", "web", csitest.PodSpec{Node: node, Volumes: []csitest.PodVolume{
		{Name: "data", Claim: "data"},
		{Name: "scratch", Source: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
	}})
	client := fakeClient(pvc, pv, csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{}))
	root := t.TempDir()
	pods := newKubeletPods(pod)
	var vm volumemanager.VolumeManager
	var sizeLimit nvm.SizeLimitConfig
	m, err := newManager(options{
		selfAttach: false, nodeName: node, podManager: pods, podState: pods, client: client,
		mounter: mount.NewFakeMounter(nil), rootDir: root, statsPeriod: time.Minute,
		mutate: func(c *nvm.Config) { privateRegistry(c); sizeLimit = c.SizeLimit },
	})
	if err != nil {
		t.Fatal(err)
	}
	// The kubelet's eviction manager acts on an emptyDir over its
	// sizeLimit: nodevol reports nothing of its own.
	if !sizeLimit.Off {
		t.Errorf("SizeLimit %+v, want the report off", sizeLimit)
	}
	vm = m
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		vm.Run(ctx, config.NewSourcesReady(func(sets.Set[string]) bool { return true }))
	}()
	t.Cleanup(func() { cancel(); <-done })

	if err := m.ValidatePlugin(ctx, drv.DriverName(), drv.Endpoint(), []string{"1.0.0"}); err != nil {
		t.Fatalf("ValidatePlugin: %v", err)
	}
	if err := m.RegisterPlugin(ctx, drv.DriverName(), drv.Endpoint(), []string{"1.0.0"}, nil); err != nil {
		t.Fatalf("RegisterPlugin: %v", err)
	}
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	if err := vm.WaitForAttachAndMount(wctx, pod); err != nil {
		t.Fatalf("WaitForAttachAndMount: %v", err)
	}

	vols := vm.GetMountedVolumesForPod(volumetypes.UniquePodName(pod.UID))
	podDir := filepath.Join(root, "pods", string(pod.UID))
	want := map[string]struct{ path, inner string }{
		"data":    {filepath.Join(podDir, "volumes", "kubernetes.io~csi", pv.Name, "mount"), pv.Name},
		"scratch": {filepath.Join(podDir, "volumes", "kubernetes.io~empty-dir", "scratch"), "scratch"},
	}
	if len(vols) != len(want) {
		t.Fatalf("GetMountedVolumesForPod: %d volumes, want %d: %+v", len(vols), len(want), vols)
	}
	for name, w := range want {
		info, ok := vols[name]
		switch {
		case !ok || info.Mounter == nil:
			t.Fatalf("volume %q: no mounter in %+v", name, vols)
		case info.Mounter.GetPath() != w.path:
			t.Errorf("volume %q: path %q, want %q", name, info.Mounter.GetPath(), w.path)
		case info.InnerVolumeSpecName != w.inner:
			t.Errorf("volume %q: inner name %q, want %q", name, info.InnerVolumeSpecName, w.inner)
		case info.BlockVolumeMapper != nil || info.ReadOnly || info.SELinuxLabeled:
			t.Errorf("volume %q: %+v", name, info)
		}
		if a := info.Mounter.GetAttributes(); !a.Managed || !a.SELinuxRelabel || a.ReadOnly {
			t.Errorf("volume %q: attributes %+v, want managed, relabelled by the runtime, writable", name, a)
		}
	}
	metrics, err := vols["data"].Mounter.GetMetrics()
	if err != nil || metrics.Capacity == nil || metrics.Used == nil {
		t.Errorf("GetMetrics of the claim: %+v, %v", metrics, err)
	}
	if m, err := vols["scratch"].Mounter.GetMetrics(); err != nil || m.Used == nil || m.Used.Value() <= 0 || m.InodesUsed.Value() <= 0 {
		t.Errorf("GetMetrics of the emptyDir: %+v, %v; want its du", m, err)
	}
	if got := drv.Calls("NodeGetVolumeStats"); got != 1 {
		t.Errorf("NodeGetVolumeStats called %d times for one volume's metrics, want 1", got)
	}
	// The driver needs no attach: as the kubelet's, the node status lists
	// none of the pod's volumes, and the claim's counts as attached.
	if inUse := vm.GetVolumesInUse(); len(inUse) != 0 {
		t.Errorf("volumes in use %v: want none (only attachable volumes are listed)", inUse)
	}
	if name := v1.UniqueVolumeName(podvol.CSIVolumeName(drv.DriverName(), "vol-1")); !vm.VolumeIsAttached(name) {
		t.Errorf("VolumeIsAttached(%s) = false, want true (it needs no attach)", name)
	}

	pods.terminate(pod.UID, true)
	if err := vm.WaitForUnmount(wctx, pod); err != nil {
		t.Fatalf("WaitForUnmount: %v", err)
	}
	if vm.HasPossiblyMountedVolumesForPod(volumetypes.UniquePodName(pod.UID)) {
		t.Error("the terminated pod still has volumes that may be mounted")
	}
	if got := drv.PublishedVolumes(); len(got) != 0 {
		t.Errorf("still published after the pod's unmount: %v", got)
	}
}

// TestKubeletError checks the errors the kubelet acts on: an attach limit
// becomes its *VolumeAttachLimitExceededError (the pod is rejected), a
// wait that ran out of time stays one wait.Interrupted recognises.
func TestKubeletError(t *testing.T) {
	limit := &nvm.WaitError{Pod: "ns/web", What: "unmounted volumes", Volumes: []string{"data", "logs"}, Final: true,
		Err: &nvm.VolumeAttachLimitExceededError{Pod: "ns/web", Volume: "data", Driver: "d", VolumeAttachment: "csi-1"}}
	var kerr *volumemanager.VolumeAttachLimitExceededError
	if err := kubeletError(limit); !errors.As(err, &kerr) {
		t.Fatalf("attach limit: %T %v, want the kubelet's VolumeAttachLimitExceededError", err, err)
	}
	if len(kerr.UnattachedVolumes) != 1 || kerr.UnattachedVolumes[0] != "data" || len(kerr.UnmountedVolumes) != 2 || !errors.Is(kerr.OriginalError, limit) {
		t.Errorf("attach limit: %+v", kerr)
	}
	timeout := &nvm.WaitError{Pod: "ns/web", What: "unmounted volumes", Volumes: []string{"data"}, Err: context.DeadlineExceeded}
	if err := kubeletError(timeout); err != error(timeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("timeout: %v, want nodevol's error unchanged, unwrapping to the deadline", err)
	}
	if err := kubeletError(nil); err != nil {
		t.Errorf("nil: %v", err)
	}
}

// TestVolumePluginDir: the kubelet's --volume-plugin-dir is nodevol's
// directory of flexVolume drivers.
func TestVolumePluginDir(t *testing.T) {
	dir := t.TempDir()
	pods := newKubeletPods()
	var got string
	_, err := newManager(options{nodeName: node, podManager: pods, podState: pods, client: fakeClient(),
		mounter: mount.NewFakeMounter(nil), rootDir: t.TempDir(), volumePluginDir: dir,
		mutate: func(c *nvm.Config) { privateRegistry(c); got = c.VolumePluginDir }})
	if err != nil {
		t.Fatal(err)
	}
	if got != dir {
		t.Errorf("Config.VolumePluginDir = %q, want the kubelet's %q", got, dir)
	}
}
