package driver

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// fakeLoop is loopDevices in memory. Its "devices" are regular files in
// a temporary directory, so that the driver can stat them. With linger
// set it detaches like the kernel does a device that something else has
// open: Detach only marks the device, which stays attached (and
// Detaching) for linger more Find calls of its image, or until release
// if linger is negative.
type fakeLoop struct {
	dir string

	mu       sync.Mutex
	n        int
	attached map[string][]string // image -> devices
	detached []string
	linger   int
	pending  map[string]int // device being detached -> Find calls left, negative: until release
}

func (f *fakeLoop) Find(_ context.Context, image string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, dev := range slices.Clone(f.attached[image]) {
		switch left, ok := f.pending[dev]; {
		case !ok || left < 0:
		case left == 0:
			f.remove(dev)
		default:
			f.pending[dev]--
		}
	}
	return slices.Clone(f.attached[image]), nil
}

func (f *fakeLoop) Attach(_ context.Context, image string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	dev := filepath.Join(f.dir, fmt.Sprintf("loop%d", f.n))
	f.n++
	if err := os.WriteFile(dev, nil, 0o600); err != nil {
		return "", err
	}
	f.attached[image] = append(f.attached[image], dev)
	return dev, nil
}

func (f *fakeLoop) Detach(_ context.Context, dev string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.isAttached(dev) {
		return fmt.Errorf("%s is not attached", dev)
	}
	if _, ok := f.pending[dev]; ok {
		return nil // marked again, like LOOP_CLR_FD does
	}
	if f.linger != 0 {
		if f.pending == nil {
			f.pending = map[string]int{}
		}
		f.pending[dev] = f.linger
		return nil
	}
	f.remove(dev)
	return nil
}

func (f *fakeLoop) Detaching(_ context.Context, dev string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.pending[dev]
	return ok, nil
}

// release finishes every pending detach, like the last close does.
func (f *fakeLoop) release() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for dev := range f.pending {
		f.remove(dev)
	}
}

func (f *fakeLoop) isAttached(dev string) bool {
	for _, devs := range f.attached {
		if slices.Contains(devs, dev) {
			return true
		}
	}
	return false
}

// remove detaches dev for good; f.mu is held.
func (f *fakeLoop) remove(dev string) {
	for img, devs := range f.attached {
		if i := slices.Index(devs, dev); i >= 0 {
			f.attached[img] = slices.Delete(devs, i, i+1)
			f.detached = append(f.detached, dev)
		}
	}
	delete(f.pending, dev)
}

func (f *fakeLoop) Refresh(context.Context, string) error { return nil }

func (f *fakeLoop) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, devs := range f.attached {
		n += len(devs)
	}
	return n
}

type fixture struct {
	dir     string
	loop    *fakeLoop
	mounter *mount.FakeMounter
	ctrl    csi.ControllerClient
	node    csi.NodeClient
}

// newFixture serves a driver with fake loop devices and mounts on a
// unix socket; cfg's NodeID, StateDir, Loop and Mounter are filled in.
func newFixture(t *testing.T, cfg options) *fixture {
	t.Helper()
	dir := t.TempDir()
	f := &fixture{dir: dir, loop: &fakeLoop{dir: t.TempDir(), attached: map[string][]string{}}, mounter: mount.NewFakeMounter(nil)}
	cfg.NodeID, cfg.StateDir, cfg.Loop, cfg.Mounter = "node-1", filepath.Join(dir, "state"), f.loop, f.mounter
	f.serve(t, cfg)
	return f
}

func (f *fixture) serve(t *testing.T, cfg options) {
	t.Helper()
	d, err := newServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(csitest.SocketDir(t), "csi.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.serve(ctx, lis) }()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	f.ctrl, f.node = csi.NewControllerClient(conn), csi.NewNodeClient(conn)
}

func wantCode(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Errorf("%s: got %v (%v), want %v", what, got, err, want)
	}
}

func (f *fixture) create(t *testing.T, name string) string {
	t.Helper()
	resp, err := f.ctrl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{
		Name:               name,
		VolumeCapabilities: []*csi.VolumeCapability{blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)},
	})
	if err != nil {
		t.Fatalf("CreateVolume(%s): %v", name, err)
	}
	return resp.GetVolume().GetVolumeId()
}

func TestCreateVolumeIdempotentByName(t *testing.T) {
	f := newFixture(t, options{})
	ctx := context.Background()
	caps := []*csi.VolumeCapability{mountCap("", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)}
	req := &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: caps, CapacityRange: &csi.CapacityRange{RequiredBytes: 20 << 20}}
	a, err := f.ctrl.CreateVolume(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := f.ctrl.CreateVolume(ctx, req)
	if err != nil || b.GetVolume().GetVolumeId() != a.GetVolume().GetVolumeId() || b.GetVolume().GetCapacityBytes() != 20<<20 {
		t.Fatalf("second CreateVolume = %v, %v; want the same volume", b, err)
	}
	fi, err := os.Stat(filepath.Join(f.dir, "state", "volumes", a.GetVolume().GetVolumeId()+".img"))
	if err != nil || fi.Size() != 20<<20 {
		t.Fatalf("image: %v, %v", fi, err)
	}
	req.CapacityRange = &csi.CapacityRange{RequiredBytes: 40 << 20}
	_, err = f.ctrl.CreateVolume(ctx, req)
	wantCode(t, "same name, bigger size", err, codes.AlreadyExists)
	for _, name := range []string{"", "..", "a/b", "a\x00b"} {
		_, err := f.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: caps})
		wantCode(t, fmt.Sprintf("name %q", name), err, codes.InvalidArgument)
	}
	_, err = f.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "x", VolumeCapabilities: caps, Parameters: map[string]string{"speed": "fast"}})
	wantCode(t, "unknown parameter", err, codes.InvalidArgument)
	_, err = f.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "x", VolumeCapabilities: caps, AccessibilityRequirements: &csi.TopologyRequirement{
		Requisite: []*csi.Topology{{Segments: map[string]string{topologyKey(DefaultDriverName): "node-2"}}},
	}})
	wantCode(t, "other node's topology", err, codes.ResourceExhausted)
}

func TestNodeOrderAndRollback(t *testing.T) {
	var failStage bool
	f := newFixture(t, options{FaultHook: func(_ context.Context, method, _ string, at faultPoint) error {
		if failStage && method == "NodeStageVolume" && at == atMid {
			return status.Error(codes.Unavailable, "injected")
		}
		return nil
	}})
	ctx := context.Background()
	id := f.create(t, "vol")
	bc := blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	staging, target := filepath.Join(f.dir, "staging"), filepath.Join(f.dir, "pod", "dev")
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		t.Fatal(err)
	}
	stage := &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: bc}
	pub := &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: bc}

	_, err := f.node.NodePublishVolume(ctx, pub)
	wantCode(t, "publish before stage", err, codes.FailedPrecondition)

	failStage = true
	_, err = f.node.NodeStageVolume(ctx, stage)
	wantCode(t, "stage with injected fault", err, codes.Unavailable)
	if n := f.loop.count(); n != 0 {
		t.Fatalf("failed stage left %d loop devices attached", n)
	}
	failStage = false

	for i := range 2 {
		if _, err := f.node.NodeStageVolume(ctx, stage); err != nil {
			t.Fatalf("stage #%d: %v", i, err)
		}
	}
	if n := f.loop.count(); n != 1 {
		t.Fatalf("after two stages: %d loop devices, want 1", n)
	}
	for i := range 2 {
		if _, err := f.node.NodePublishVolume(ctx, pub); err != nil {
			t.Fatalf("publish #%d: %v", i, err)
		}
	}
	ro := &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: bc, Readonly: true}
	_, err = f.node.NodePublishVolume(ctx, ro)
	wantCode(t, "publish again read-only", err, codes.AlreadyExists)
	_, err = f.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	wantCode(t, "unstage while published", err, codes.FailedPrecondition)
	_, err = f.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
	wantCode(t, "delete while staged", err, codes.FailedPrecondition)

	// A restarted driver knows the volume is staged and published.
	f.serve(t, options{NodeID: "node-1", StateDir: filepath.Join(f.dir, "state"), Loop: f.loop, Mounter: f.mounter})
	if _, err := f.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Errorf("target file still there after unpublish: %v", err)
	}
	if mps, _ := f.mounter.List(); len(mps) != 0 {
		t.Errorf("mounts left after unpublish: %v", mps)
	}
	for i := range 2 {
		if _, err := f.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
			t.Fatalf("unstage #%d: %v", i, err)
		}
	}
	if n := f.loop.count(); n != 0 {
		t.Fatalf("after unstage: %d loop devices attached", n)
	}
	if _, err := f.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
	_, err = f.node.NodeStageVolume(ctx, stage)
	wantCode(t, "stage of deleted volume", err, codes.NotFound)
}

func TestRequestValidation(t *testing.T) {
	f := newFixture(t, options{})
	ctx := context.Background()
	id := f.create(t, "vol")
	bc := blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	for _, tc := range []struct {
		name string
		call func() error
		want codes.Code
	}{
		{"stage without ID", func() error {
			_, err := f.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{StagingTargetPath: "/s", VolumeCapability: bc})
			return err
		}, codes.InvalidArgument},
		{"stage with relative path", func() error {
			_, err := f.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: "s", VolumeCapability: bc})
			return err
		}, codes.InvalidArgument},
		{"stage into the state dir", func() error {
			_, err := f.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: filepath.Join(f.dir, "state", "volumes"), VolumeCapability: bc})
			return err
		}, codes.InvalidArgument},
		{"stage with traversal ID", func() error {
			_, err := f.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "../../etc", StagingTargetPath: "/s", VolumeCapability: bc})
			return err
		}, codes.InvalidArgument},
		{"stage unknown volume", func() error {
			_, err := f.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "nope", StagingTargetPath: "/s", VolumeCapability: bc})
			return err
		}, codes.NotFound},
		{"publish without capability", func() error {
			_, err := f.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: "/t", StagingTargetPath: "/s"})
			return err
		}, codes.InvalidArgument},
		{"stats on a path not published", func() error {
			_, err := f.node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: "/elsewhere"})
			return err
		}, codes.NotFound},
		{"controller publish to another node", func() error {
			_, err := f.ctrl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-2", VolumeCapability: bc})
			return err
		}, codes.NotFound},
		{"list with a foreign token", func() error {
			_, err := f.ctrl.ListVolumes(ctx, &csi.ListVolumesRequest{StartingToken: "page-2"})
			return err
		}, codes.Aborted},
		{"expand without range", func() error {
			_, err := f.ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id})
			return err
		}, codes.InvalidArgument},
	} {
		wantCode(t, tc.name, tc.call(), tc.want)
	}
}

// TestPerVolumeLock checks that a slow call on one volume holds up the
// next call on that volume only.
func TestPerVolumeLock(t *testing.T) {
	release := make(chan struct{})
	f := newFixture(t, options{FaultHook: func(ctx context.Context, method, id string, at faultPoint) error {
		if method == "ControllerExpandVolume" && at == atMid {
			<-release
		}
		return nil
	}})
	ctx := context.Background()
	a, b := f.create(t, "a"), f.create(t, "b")
	done := make(chan error, 1)
	go func() {
		_, err := f.ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: a, CapacityRange: &csi.CapacityRange{RequiredBytes: 128 << 20}})
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	if _, err := f.ctrl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: b, NodeId: "node-1",
		VolumeCapability: blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)}); err != nil {
		t.Fatalf("call on another volume while a is busy: %v", err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err := f.ctrl.DeleteVolume(short, &csi.DeleteVolumeRequest{VolumeId: a})
	if c := status.Code(err); c != codes.Aborted && c != codes.DeadlineExceeded {
		t.Errorf("call on the busy volume: %v, want Aborted or DeadlineExceeded", err)
	}
	// The server gave up waiting too: once a is free, it is still there.
	time.Sleep(100 * time.Millisecond)
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("expand: %v", err)
	}
	got, err := f.ctrl.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: a})
	if err != nil || got.GetVolume().GetCapacityBytes() != 128<<20 {
		t.Fatalf("after expand: %v, %v", got, err)
	}
}

// syncBuffer is a bytes.Buffer safe for the driver's writes and the test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b = append(s.b, p...)
	return len(p), nil
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return string(s.b)
}

func TestCallLog(t *testing.T) {
	var calls syncBuffer
	f := newFixture(t, options{CallLog: &calls, FaultHook: func(_ context.Context, method, _ string, _ faultPoint) error {
		if method == "NodeGetVolumeStats" {
			return status.Error(codes.Unavailable, "injected")
		}
		return nil
	}})
	ctx := context.Background()
	id := f.create(t, "vol") // controller RPCs are not logged
	bc := blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	staging, target := filepath.Join(f.dir, "staging"), filepath.Join(f.dir, "pod", "dev")
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		t.Fatal(err)
	}
	if _, err := f.node.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: bc}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: bc}); err != nil {
		t.Fatal(err)
	}
	// A call that fails (here before it runs) is logged all the same.
	_, err := f.node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: target})
	wantCode(t, "stats with injected fault", err, codes.Unavailable)
	if _, err := f.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	want := "NodeGetCapabilities\t-\t-\t-\n" +
		"NodeStageVolume\t" + id + "\t-\t" + staging + "\n" +
		"NodePublishVolume\t" + id + "\t" + target + "\t" + staging + "\n" +
		"NodeGetVolumeStats\t" + id + "\t" + target + "\t-\n" +
		"NodeUnpublishVolume\t" + id + "\t" + target + "\t-\n" +
		"NodeUnstageVolume\t" + id + "\t-\t" + staging + "\n"
	if got := calls.String(); got != want {
		t.Errorf("call log:\n%s\nwant:\n%s", got, want)
	}
}

// TestCallLogFlag runs the command line with --call-log: the file is
// appended to, not truncated, one line per Node service RPC.
func TestCallLogFlag(t *testing.T) {
	dir := csitest.SocketDir(t)
	logPath, sock := filepath.Join(dir, "calls.log"), filepath.Join(dir, "csi.sock")
	if err := os.WriteFile(logPath, []byte("earlier\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan int, 1)
	var stderr syncBuffer
	go func() {
		exited <- mainContext(ctx, []string{"--endpoint", "unix://" + sock, "--nodeid", "node-1",
			"--statedir", filepath.Join(dir, "state"), "--call-log", logPath}, &stderr)
	}()
	defer func() {
		cancel()
		if code := <-exited; code != 0 {
			t.Errorf("exit code %d: %s", code, stderr.String())
		}
	}()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	node := csi.NewNodeClient(conn)
	callCtx, done := context.WithTimeout(ctx, 20*time.Second)
	defer done()
	// WaitForReady: the driver may not listen yet.
	if _, err := node.NodeGetInfo(callCtx, &csi.NodeGetInfoRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	if _, err := csi.NewIdentityClient(conn).Probe(callCtx, &csi.ProbeRequest{}); err != nil {
		t.Fatal(err)
	}
	// A target that exists: an unknown volume with nothing at its target
	// is success.
	if err := os.Mkdir(filepath.Join(dir, "t"), 0o750); err != nil {
		t.Fatal(err)
	}
	_, err = node.NodeUnpublishVolume(callCtx, &csi.NodeUnpublishVolumeRequest{VolumeId: "nope", TargetPath: filepath.Join(dir, "t")})
	wantCode(t, "unpublish of an unknown volume", err, codes.NotFound)
	data, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	want := "earlier\nNodeGetInfo\t-\t-\t-\nNodeUnpublishVolume\tnope\t" + filepath.Join(dir, "t") + "\t-\n"
	if string(data) != want {
		t.Errorf("call log file:\n%s\nwant:\n%s", data, want)
	}
}
