package volumemanager

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/util/blockdev"
)

// recordingBlockMapper records map and unmap calls by pod.
type recordingBlockMapper struct {
	mu    sync.Mutex
	calls []string
}

func (r *recordingBlockMapper) Map(_ context.Context, m blockdev.Map) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, "map "+m.PodUID)
	return nil
}

func (r *recordingBlockMapper) Unmap(_ context.Context, m blockdev.Map) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, "unmap "+m.PodUID)
	return nil
}

func (r *recordingBlockMapper) count(prefix string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.calls {
		if strings.HasPrefix(c, prefix) {
			n++
		}
	}
	return n
}

// TestBlockVolumeSharedByPods: two pods map one RWX block volume (one of
// them read-only): it is staged once and published and mapped per pod; the
// first pod's going unmaps and unpublishes only its own; the device is
// unstaged once the last pod has gone.
func TestBlockVolumeSharedByPods(t *testing.T) {
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
	pvc, pv := csitest.BoundClaim("ns", "raw", drv.DriverName(), "handle-raw", csitest.PVBlock(), csitest.PVAccessModes(v1.ReadWriteMany))
	csitest.PVCBlock()(pvc)
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), false), pvc, pv)
	bm := &recordingBlockMapper{}
	vm, err := New(Config{NodeName: node, KubeClient: client, RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil), BlockMapper: bm})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- vm.Run(ctx) }()
	defer func() { cancel(); <-done }()
	if err := vm.Drivers().Register(ctx, drv.DriverName(), drv.Endpoint()); err != nil {
		t.Fatal(err)
	}
	a := csitest.Pod("ns", "a", csitest.WithBlockPVC("raw", "raw", false))
	b := csitest.Pod("ns", "b", csitest.WithBlockPVC("raw", "raw", true))
	for _, p := range []*v1.Pod{a, b} {
		vm.AddPod(p)
		if err := vm.WaitForAttachAndMount(ctx, p); err != nil {
			t.Fatal(err)
		}
		vols := vm.GetMountedVolumesForPod(p.UID)
		if len(vols) != 1 || !strings.HasSuffix(vols[0].Path, "/volumeDevices/kubernetes.io~csi/"+pv.Name) {
			t.Fatalf("pod %s volumes %+v, want its device path", p.Name, vols)
		}
	}
	if n := drv.Calls("NodeStageVolume"); n != 1 {
		t.Errorf("NodeStageVolume calls %d, want 1", n)
	}
	if bm.count("map") != 2 {
		t.Errorf("map calls %v, want one per pod", bm.calls)
	}
	var readOnly []bool
	for _, r := range drv.Requests() {
		if p, ok := r.Req.(*csi.NodePublishVolumeRequest); ok {
			if p.GetVolumeCapability().GetBlock() == nil {
				t.Errorf("NodePublishVolume without block access: %v", p)
			}
			readOnly = append(readOnly, p.GetReadonly())
		}
	}
	if len(readOnly) != 2 || readOnly[0] || !readOnly[1] {
		t.Errorf("NodePublishVolume read-only flags %v, want [false true]", readOnly)
	}

	vm.DeletePod(a)
	if err := vm.WaitForUnmount(ctx, a); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, vm)
	if bm.count("unmap") != 1 || drv.Calls("NodeUnpublishVolume") != 1 || drv.Calls("NodeUnstageVolume") != 0 {
		t.Errorf("after pod a went: mapper %v, unpublish %d, unstage %d; want a's unmap and unpublish only",
			bm.calls, drv.Calls("NodeUnpublishVolume"), drv.Calls("NodeUnstageVolume"))
	}
	vm.DeletePod(b)
	if err := vm.WaitForUnmount(ctx, b); err != nil {
		t.Fatal(err)
	}
	eventually(t, "device unstaged", func() bool { return drv.Calls("NodeUnstageVolume") == 1 && len(vm.GetVolumesInUse()) == 0 })
	if got := bm.calls; len(got) != 4 || got[2] != "unmap "+string(a.UID) || got[3] != "unmap "+string(b.UID) {
		t.Errorf("mapper calls %v: want both maps, then a's unmap, then b's", got)
	}
}

// fakeLooper is a Looper without loop devices.
type fakeLooper struct {
	mu  sync.Mutex
	dev map[string]string
}

func (f *fakeLooper) Attach(_ context.Context, path string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dev[path] = "/dev/loop9"
	return "/dev/loop9", nil
}

func (f *fakeLooper) Find(_ context.Context, path string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.dev[path], nil
}

func (f *fakeLooper) Detach(_ context.Context, dev string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for p, d := range f.dev {
		if d == dev {
			delete(f.dev, p)
		}
	}
	return nil
}

// TestBlockRestartReconstructs: a block volume mapped by a manager that
// stopped is found on disk by the next one (pod symlink, data directory)
// and, once the pods are synced and no pod wants it, unmapped,
// unpublished and unstaged, its directories removed.
func TestBlockRestartReconstructs(t *testing.T) {
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
	pvc, pv := csitest.BoundClaim("ns", "raw", drv.DriverName(), "handle-raw", csitest.PVBlock())
	csitest.PVCBlock()(pvc)
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), false), pvc, pv)
	root := t.TempDir()
	loops := &fakeLooper{dev: map[string]string{}}
	start := func() (*VolumeManager, func()) {
		m := mount.NewFakeMounter(nil)
		mapper := &blockdev.Mapper{Mounter: m, Loop: loops, IsBlockDevice: func(string) (bool, error) { return true, nil }}
		vm, err := New(Config{NodeName: node, KubeClient: client, RootDir: root, Mounter: m, BlockMapper: mapper})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- vm.Run(ctx) }()
		if err := vm.Drivers().Register(ctx, drv.DriverName(), drv.Endpoint()); err != nil {
			t.Fatal(err)
		}
		<-vm.ready
		return vm, func() { cancel(); <-done }
	}
	vm, stop := start()
	pod := csitest.Pod("ns", "a", csitest.WithBlockPVC("raw", "raw", false))
	vm.AddPod(pod)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	stop()

	vm, stop = start()
	defer stop()
	if !vm.HasPossiblyMountedVolumesForPod(pod.UID) {
		t.Fatal("the mapped block volume was not found on disk")
	}
	vm.MarkPodsSynced()
	if err := vm.WaitForUnmount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	eventually(t, "block volume unstaged", func() bool { return len(vm.GetVolumesInUse()) == 0 })
	if drv.Calls("NodeUnpublishVolume") != 1 || drv.Calls("NodeUnstageVolume") != 1 || len(loops.dev) != 0 {
		t.Errorf("unpublish %d, unstage %d, loop devices %v; want one each and none left",
			drv.Calls("NodeUnpublishVolume"), drv.Calls("NodeUnstageVolume"), loops.dev)
	}
	if m, _ := filepath.Glob(filepath.Join(root, "plugins", "kubernetes.io", "csi", "volumeDevices", "*", pv.Name)); len(m) > 0 {
		t.Errorf("left behind: %v", m)
	}
	if m, _ := filepath.Glob(filepath.Join(root, "pods", "*", "volumeDevices", "kubernetes.io~csi", "*")); len(m) > 0 {
		t.Errorf("left behind: %v", m)
	}
}

// TestSharedVolumeRPCs: 100 pods of one RWX volume cost exactly one
// NodeStageVolume and one NodePublishVolume each, although plans made from
// snapshots taken while other pods' publishes finish ask for some twice.
func TestSharedVolumeRPCs(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.claim("shared", csitest.PVAccessModes(v1.ReadWriteMany))
	var pods []*v1.Pod
	for i := 0; i < 100; i++ {
		p := csitest.Pod("ns", "pod-"+strconv.Itoa(i), csitest.WithPVC("data", "shared", false))
		pods = append(pods, p)
		e.vm.AddPod(p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, p := range pods {
		if err := e.vm.WaitForAttachAndMount(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	waitIdle(t, e.vm)
	if s, p := e.drv.Calls("NodeStageVolume"), e.drv.Calls("NodePublishVolume"); s != 1 || p != 100 {
		t.Errorf("NodeStageVolume %d, NodePublishVolume %d; want 1 and 100", s, p)
	}
}
