package volumemanager

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/blockdev"
	"github.com/nodevol/nodevol/internal/ondisk"
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
	pvc, pv := csitest.BoundClaim("ns", "raw", csitest.PVSpec{
		Driver:      drv.DriverName(),
		Handle:      "handle-raw",
		Block:       true,
		AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteMany},
	})
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{}), pvc, pv)
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
	a := csitest.Pod("ns", "a", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "raw", Claim: "raw", Block: true}}})
	b := csitest.Pod("ns", "b", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "raw", Claim: "raw", ReadOnly: true, Block: true}}})
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
	waitUnstaged(t, vm)
	if drv.Calls("NodeUnstageVolume") != 1 || len(knownVolumes(vm)) != 0 {
		t.Errorf("after WaitForUnstaged: %d NodeUnstageVolume calls, in use %v; want 1 and none", drv.Calls("NodeUnstageVolume"), knownVolumes(vm))
	}
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
	pvc, pv := csitest.BoundClaim("ns", "raw", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-raw", Block: true})
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{}), pvc, pv)
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
	pod := csitest.Pod("ns", "a", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "raw", Claim: "raw", Block: true}}})
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
	waitUnstaged(t, vm)
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
	e.claimWith("shared", csitest.PVSpec{AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteMany}})
	var pods []*v1.Pod
	for i := 0; i < 100; i++ {
		p := csitest.Pod("ns", "pod-"+strconv.Itoa(i), csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "shared"}}})
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

// blockCrash is a block volume's state after a manager was stopped in
// unmapPodDevice right before NodeUnpublishVolume.
type blockCrash struct {
	drv   *csitest.Server
	cfg   Config
	pod   *v1.Pod
	paths ondisk.BlockPaths
}

// stopBeforeBlockUnpublish maps a pod's block volume with one manager,
// stops it, and does what unmapPodDevice does before NodeUnpublishVolume:
// the mapper's unmap (symlink and map file gone), then the record
// Unpublishing. The publish path stays.
func stopBeforeBlockUnpublish(t *testing.T) blockCrash {
	t.Helper()
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
	pvc, pv := csitest.BoundClaim("ns", "raw", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-raw", Block: true})
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{}), pvc, pv)
	root := t.TempDir()
	boot := filepath.Join(t.TempDir(), "boot_id")
	plantFile(t, boot, "boot-1\n")
	m := mount.NewFakeMounter(nil) // one mount table for both runs
	mapper := &blockdev.Mapper{Mounter: m, Loop: &fakeLooper{dev: map[string]string{}}, IsBlockDevice: func(string) (bool, error) { return true, nil }}
	cfg := Config{NodeName: node, KubeClient: client, RootDir: root, Mounter: m, BlockMapper: mapper, BootIDPath: boot}

	vm, stop := startVMWith(t, cfg, drv)
	pod := csitest.Pod("ns", "a", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "raw", Claim: "raw", Block: true}}})
	vm.AddPod(pod)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	stop()

	// What unmapPodDevice has done when it is stopped right before
	// NodeUnpublishVolume: the mapper's unmap, then the record.
	paths, err := ondisk.BlockVolumePaths(root, pv.Name, pod.UID)
	if err != nil {
		t.Fatal(err)
	}
	if err := mapper.Unmap(context.Background(), blockdev.Map{DevicePath: paths.PublishPath, GlobalMapPath: paths.GlobalMapPath,
		PodUID: string(pod.UID), PodDeviceDir: paths.PodDeviceDir, Name: pv.Name}); err != nil {
		t.Fatal(err)
	}
	r := mustRoot(t, root)
	rel := relTo(t, root, paths.PublishPath)
	rec, err := ondisk.ReadRecord(r, rel)
	if err != nil {
		t.Fatal(err)
	}
	rec.Phase = ondisk.PhaseUnpublishing
	b, _ := json.Marshal(rec)
	plantFile(t, filepath.Join(root, ondisk.RecordFile(rel)), string(b))
	if _, err := os.Lstat(paths.PodDevicePath); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("pod symlink after the unmap: %v, want it gone", err)
	}
	if _, err := os.Lstat(paths.PublishPath); err != nil {
		t.Fatalf("publish path after the unmap: %v, want it there", err)
	}
	return blockCrash{drv: drv, cfg: cfg, pod: pod, paths: paths}
}

// blockCallsSince are the stage and publish calls the driver received
// after its first n requests.
func blockCallsSince(drv *csitest.Server, n int) []string {
	var calls []string
	for _, req := range drv.Requests()[n:] {
		switch req.Method {
		case "NodeUnpublishVolume", "NodeUnstageVolume", "NodePublishVolume", "NodeStageVolume":
			calls = append(calls, req.Method)
		}
	}
	return calls
}

// TestBlockRestartBetweenUnmapAndUnpublish (issue 23, crash window 1): a
// manager stopped after unmapping a pod's block volume (its symlink and map
// file gone) but before NodeUnpublishVolume (the publish path there, the
// record Unpublishing) leaves a publish that no pod symlink leads to. The
// next manager, the pod deleted, finds it from the publish path, unpublishes
// it, then unstages the volume: the strict driver ends with nothing staged
// or published, and nothing of the volume is left on disk.
func TestBlockRestartBetweenUnmapAndUnpublish(t *testing.T) {
	c := stopBeforeBlockUnpublish(t)
	drv, root := c.drv, c.cfg.RootDir
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	before := len(drv.Requests())
	vm, stop := startVMWith(t, c.cfg, drv)
	defer stop()
	vm.MarkPodsSynced() // the pod is gone
	settled := func() bool {
		_, staged := drv.StagedVolumes()["handle-raw"]
		return !staged && len(drv.PublishedVolumes()["handle-raw"]) == 0 && len(knownVolumes(vm)) == 0 && vm.idle()
	}
	if err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 10*time.Second, true,
		func(context.Context) (bool, error) { return settled(), nil }); err != nil {
		_, staged := drv.StagedVolumes()["handle-raw"]
		t.Fatalf("after the restart: driver staged %v, published at %v, volumes in use %v; want nothing (%v)",
			staged, drv.PublishedVolumes()["handle-raw"], knownVolumes(vm), err)
	}
	if want, calls := []string{"NodeUnpublishVolume", "NodeUnstageVolume"}, blockCallsSince(drv, before); !slices.Equal(calls, want) {
		t.Errorf("CSI calls after the restart %v, want %v", calls, want)
	}
	// The layout's shared directories may stay (staging/ and publish/, the
	// records' shards); nothing of the volume may.
	volumeDevices := filepath.Join(root, "plugins/kubernetes.io/csi/volumeDevices")
	for _, p := range filesUnder(t, volumeDevices) {
		if p != filepath.Join(volumeDevices, "staging") && p != filepath.Join(volumeDevices, "publish") {
			t.Errorf("left behind: %s", p)
		}
	}
	records := filepath.Join(root, ondisk.RecordsDir)
	for _, p := range filesUnder(t, records) {
		if fi, err := os.Lstat(p); err != nil || !fi.IsDir() || filepath.Dir(p) != records {
			t.Errorf("left behind: %s", p)
		}
	}
}

// TestBlockRestartBetweenUnmapAndUnpublishPodBack: the same stop, with the
// pod still wanted after the restart: its volume is published and mapped
// again (the symlink back), never unstaged.
func TestBlockRestartBetweenUnmapAndUnpublishPodBack(t *testing.T) {
	c := stopBeforeBlockUnpublish(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	before := len(c.drv.Requests())
	vm, stop := startVMWith(t, c.cfg, c.drv)
	defer stop()
	vm.AddPod(c.pod)
	vm.MarkPodsSynced()
	if err := vm.WaitForAttachAndMount(ctx, c.pod); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, vm)
	if target, err := os.Readlink(c.paths.PodDevicePath); err != nil || target != c.paths.PublishPath {
		t.Errorf("pod symlink %q, %v; want it to point to %s", target, err, c.paths.PublishPath)
	}
	if calls := blockCallsSince(c.drv, before); slices.Contains(calls, "NodeUnstageVolume") || !slices.Contains(calls, "NodePublishVolume") {
		t.Errorf("CSI calls after the restart %v, want a publish and no unstage", calls)
	}
	if got := c.drv.PublishedVolumes()["handle-raw"]; len(got) != 1 || got[0] != c.paths.PublishPath {
		t.Errorf("driver publishes %v, want %s", got, c.paths.PublishPath)
	}
}

// filesUnder lists everything below dir (not dir itself), without
// following symlinks; nothing when dir is missing.
func filesUnder(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		switch {
		case errors.Is(err, fs.ErrNotExist) && p == dir:
			return filepath.SkipDir
		case err != nil:
			return err
		case p != dir:
			out = append(out, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
