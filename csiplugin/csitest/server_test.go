package csitest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// client is a test's view of a Server: one connection, and helpers for the
// node calls that take the usual arguments.
type client struct {
	csi.NodeClient
	csi.IdentityClient
	csi.ControllerClient
}

func dial(t testing.TB, s *Server) *client {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+s.Endpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &client{NodeClient: csi.NewNodeClient(conn), IdentityClient: csi.NewIdentityClient(conn), ControllerClient: csi.NewControllerClient(conn)}
}

func ctxFor(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func mountCap() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

func blockCap() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

func (c *client) stage(vol, path string, vc *csi.VolumeCapability) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol, StagingTargetPath: path, VolumeCapability: vc})
	return err
}

func (c *client) unstage(vol, path string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol, StagingTargetPath: path})
	return err
}

func (c *client) publish(vol, staging, target string, vc *csi.VolumeCapability, readOnly bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
		VolumeId: vol, StagingTargetPath: staging, TargetPath: target, VolumeCapability: vc, Readonly: readOnly,
	})
	return err
}

func (c *client) unpublish(vol, target string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol, TargetPath: target})
	return err
}

func TestIdentityAndCapabilities(t *testing.T) {
	s := New(t, Options{
		DriverName: "x.example.com", NodeID: "n7", MaxVolumes: 9,
		Topology:       map[string]string{"zone": "z1"},
		GetVolumeStats: true, Expand: true,
	})
	c := dial(t, s)
	ctx := ctxFor(t)
	info, err := c.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil || info.GetName() != "x.example.com" || info.GetVendorVersion() == "" {
		t.Errorf("GetPluginInfo = %v, %v", info, err)
	}
	if p, err := c.Probe(ctx, &csi.ProbeRequest{}); err != nil || !p.GetReady().GetValue() {
		t.Errorf("Probe = %v, %v", p, err)
	}
	pc, err := c.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	if err != nil || len(pc.GetCapabilities()) != 1 {
		t.Errorf("GetPluginCapabilities = %v, %v", pc, err)
	}
	ni, err := c.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil || ni.GetNodeId() != "n7" || ni.GetMaxVolumesPerNode() != 9 || ni.GetAccessibleTopology().GetSegments()["zone"] != "z1" {
		t.Errorf("NodeGetInfo = %v, %v", ni, err)
	}
	nc, err := c.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[csi.NodeServiceCapability_RPC_Type]bool{}
	for _, c := range nc.GetCapabilities() {
		got[c.GetRpc().GetType()] = true
	}
	for _, want := range []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
	} {
		if !got[want] {
			t.Errorf("NodeGetCapabilities lacks %v", want)
		}
	}
	cc, err := c.ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})
	if err != nil || len(cc.GetCapabilities()) != 0 {
		t.Errorf("ControllerGetCapabilities = %v, %v", cc, err)
	}

	// The defaults: staging on, nothing else.
	d := dial(t, New(t, Options{}))
	nc, err = d.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{})
	if err != nil || len(nc.GetCapabilities()) != 1 || nc.GetCapabilities()[0].GetRpc().GetType() != csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME {
		t.Errorf("default NodeGetCapabilities = %v, %v", nc, err)
	}
	ni, err = d.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil || ni.GetNodeId() != DefaultNodeID {
		t.Errorf("default NodeGetInfo = %v, %v", ni, err)
	}
	if _, err := d.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "v", VolumePath: "/p"}); status.Code(err) != codes.Unimplemented {
		t.Errorf("NodeGetVolumeStats without the capability: %v", err)
	}
}

func TestFaults(t *testing.T) {
	unavailable := status.Error(codes.Unavailable, "injected")
	t.Run("error for Times calls of one volume", func(t *testing.T) {
		s := New(t, Options{})
		c := dial(t, s)
		s.Inject(Fault{Method: "NodeStageVolume", VolumeID: "v1", Err: unavailable, Times: 2})
		for i := range 2 {
			if err := c.stage("v1", "/st", mountCap()); status.Code(err) != codes.Unavailable {
				t.Fatalf("call %d: %v, want Unavailable", i, err)
			}
		}
		if _, ok := s.StagedVolumes()["v1"]; ok {
			t.Error("a failed stage changed the state")
		}
		if err := c.stage("v2", "/st2", mountCap()); err != nil {
			t.Errorf("other volume: %v", err)
		}
		if err := c.stage("v1", "/st", mountCap()); err != nil {
			t.Errorf("after Times calls: %v", err)
		}
		if got := s.Calls("NodeStageVolume"); got != 4 {
			t.Errorf("Calls = %d, want 4", got)
		}
	})
	t.Run("forever until cleared, any method", func(t *testing.T) {
		s := New(t, Options{})
		c := dial(t, s)
		s.Inject(Fault{Err: unavailable})
		for range 3 {
			if _, err := c.Probe(ctxFor(t), &csi.ProbeRequest{}); status.Code(err) != codes.Unavailable {
				t.Fatalf("Probe: %v", err)
			}
		}
		s.ClearFaults()
		if _, err := c.Probe(ctxFor(t), &csi.ProbeRequest{}); err != nil {
			t.Fatalf("Probe after ClearFaults: %v", err)
		}
	})
	t.Run("delay ends with the caller's deadline", func(t *testing.T) {
		s := New(t, Options{})
		c := dial(t, s)
		s.Inject(Fault{Method: "NodeStageVolume", Delay: time.Hour})
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := c.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "v", StagingTargetPath: "/st", VolumeCapability: mountCap()})
		if status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("got %v, want DeadlineExceeded", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("took %v", d)
		}
		if _, ok := s.StagedVolumes()["v"]; ok {
			t.Error("a timed-out stage changed the state")
		}
	})
	t.Run("short delay then success", func(t *testing.T) {
		s := New(t, Options{})
		c := dial(t, s)
		s.Inject(Fault{Method: "NodeStageVolume", Delay: 10 * time.Millisecond, Times: 1})
		if err := c.stage("v", "/st", mountCap()); err != nil {
			t.Fatal(err)
		}
		if _, ok := s.StagedVolumes()["v"]; !ok {
			t.Error("not staged")
		}
	})
	t.Run("block holds the call until released", func(t *testing.T) {
		s := New(t, Options{})
		c := dial(t, s)
		release := make(chan struct{})
		s.Inject(Fault{Method: "NodeStageVolume", Block: release, Times: 1})
		errc := make(chan error, 1)
		go func() { errc <- c.stage("v", "/st", mountCap()) }()
		if err := s.WaitForCalls(ctxFor(t), "NodeStageVolume", 1); err != nil {
			t.Fatal(err)
		}
		if _, ok := s.StagedVolumes()["v"]; ok {
			t.Error("staged while held")
		}
		close(release)
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		if _, ok := s.StagedVolumes()["v"]; !ok {
			t.Error("not staged after release")
		}
	})
	t.Run("commit changes the state and still fails", func(t *testing.T) {
		s := New(t, Options{})
		c := dial(t, s)
		s.Inject(Fault{Method: "NodeStageVolume", Err: status.Error(codes.DeadlineExceeded, "lost"), Commit: true, Times: 1})
		if err := c.stage("v", "/st", mountCap()); status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("got %v", err)
		}
		if _, ok := s.StagedVolumes()["v"]; !ok {
			t.Error("Commit did not stage")
		}
	})
	t.Run("stop ends held calls", func(t *testing.T) {
		s := New(t, Options{})
		c := dial(t, s)
		s.Inject(Fault{Block: make(chan struct{})})
		errc := make(chan error, 1)
		go func() { errc <- c.stage("v", "/st", mountCap()) }()
		if err := s.WaitForCalls(ctxFor(t), "", 1); err != nil {
			t.Fatal(err)
		}
		s.Stop()
		if err := <-errc; status.Code(err) != codes.Unavailable {
			t.Errorf("got %v, want Unavailable", err)
		}
		s.Stop() // idempotent
	})
}

func TestConnectionsAndRecording(t *testing.T) {
	s := New(t, Options{})
	c := dial(t, s)
	const n = 50
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			vol := "v" + string(rune('a'+i%26)) + string(rune('a'+i/26))
			if err := c.stage(vol, "/st/"+vol, mountCap()); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if got := s.Connections(); got != 1 {
		t.Errorf("Connections = %d after %d calls on one connection, want 1", got, n)
	}
	if got := s.Calls("NodeStageVolume"); got != n {
		t.Errorf("Calls = %d, want %d", got, n)
	}
	reqs := s.Requests()
	if len(reqs) != n {
		t.Fatalf("Requests has %d, want %d", len(reqs), n)
	}
	r := reqs[0]
	sr, ok := r.Req.(*csi.NodeStageVolumeRequest)
	if r.Method != "NodeStageVolume" || !ok || sr.GetVolumeId() != r.VolumeID || r.Time.IsZero() {
		t.Errorf("request = %+v", r)
	}
	if !proto.Equal(sr.GetVolumeCapability(), mountCap()) {
		t.Errorf("recorded capability %v", sr.GetVolumeCapability())
	}

	if _, err := dial(t, s).Probe(ctxFor(t), &csi.ProbeRequest{}); err != nil {
		t.Fatal(err)
	}
	if got := s.Connections(); got != 2 {
		t.Errorf("Connections = %d after a second connection, want 2", got)
	}
	s.Reset()
	if s.Calls("") != 0 || len(s.Requests()) != 0 || len(s.StagedVolumes()) != n {
		t.Errorf("Reset: calls %d, requests %d, staged %d", s.Calls(""), len(s.Requests()), len(s.StagedVolumes()))
	}

	quiet := New(t, Options{NoRecord: true})
	if err := dial(t, quiet).stage("v", "/st", mountCap()); err != nil {
		t.Fatal(err)
	}
	if quiet.Calls("NodeStageVolume") != 1 || len(quiet.Requests()) != 0 {
		t.Errorf("NoRecord: calls %d, requests %d", quiet.Calls("NodeStageVolume"), len(quiet.Requests()))
	}
}

func TestWaitForCallsHonoursContext(t *testing.T) {
	s := New(t, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.WaitForCalls(ctx, "NodeStageVolume", 1); !errors.Is(err, context.Canceled) {
		t.Errorf("got %v", err)
	}
}

func TestSocketPaths(t *testing.T) {
	long := filepath.Join(t.TempDir(), strings.Repeat("d", 120))
	if err := os.MkdirAll(long, 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := Start(long, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Endpoint()) > maxSocketPath || strings.HasPrefix(s.Endpoint(), long) {
		t.Errorf("Endpoint %q did not fall back to a short path", s.Endpoint())
	}
	if _, err := dial(t, s).Probe(ctxFor(t), &csi.ProbeRequest{}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(s.Endpoint())
	s.Stop()
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("fallback dir %s not removed: %v", dir, err)
	}

	// A restart in the same directory replaces the stale socket and keeps
	// no state.
	short := SocketDir(t)
	a, err := Start(short, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if a.Endpoint() != filepath.Join(short, "csi.sock") {
		t.Errorf("Endpoint = %s", a.Endpoint())
	}
	a.Stop()
	b, err := Start(short, Options{})
	if err != nil {
		t.Fatalf("restart: %v", err)
	}
	b.Stop()

	// Something that is not a socket is not removed.
	// Short, so that Start does not fall back to a directory of its own.
	other := SocketDir(t)
	file := filepath.Join(other, "csi.sock")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if s, err := Start(other, Options{}); err == nil {
		s.Stop()
		t.Error("Start replaced a regular file")
	}
	if _, err := os.Stat(file); err != nil {
		t.Errorf("regular file removed: %v", err)
	}
}

// BenchmarkStagePublish measures the server's cost per volume for a full
// stage, publish, unpublish, unstage cycle over one connection.
func BenchmarkStagePublish(b *testing.B) {
	for _, record := range []bool{false, true} {
		b.Run(map[bool]string{false: "NoRecord", true: "Record"}[record], func(b *testing.B) {
			s := New(b, Options{NoRecord: !record})
			c := dial(b, s)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				vol := "vol-" + strconv.Itoa(i)
				i++
				if err := c.stage(vol, "/st/"+vol, mountCap()); err != nil {
					b.Fatal(err)
				}
				if err := c.publish(vol, "/st/"+vol, "/p/"+vol, mountCap(), false); err != nil {
					b.Fatal(err)
				}
				if err := c.unpublish(vol, "/p/"+vol); err != nil {
					b.Fatal(err)
				}
				if err := c.unstage(vol, "/st/"+vol); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestRestartKeepsState(t *testing.T) {
	s := New(t, Options{})
	c := dial(t, s)
	if err := c.stage("v", "/st", mountCap()); err != nil {
		t.Fatal(err)
	}
	// A call in flight during the restart fails.
	s.Inject(Fault{Method: "NodePublishVolume", Block: make(chan struct{}), Times: 1})
	errc := make(chan error, 1)
	go func() { errc <- c.publish("v", "/st", "/p", mountCap(), false) }()
	if err := s.WaitForCalls(ctxFor(t), "NodePublishVolume", 1); err != nil {
		t.Fatal(err)
	}
	if err := s.restart(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err == nil {
		t.Error("a call in flight across the restart succeeded")
	}
	// The same client connection reconnects.
	if _, err := c.NodePublishVolume(ctxFor(t), &csi.NodePublishVolumeRequest{
		VolumeId: "v", StagingTargetPath: "/st", TargetPath: "/p", VolumeCapability: mountCap(),
	}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("publish after restart: %v", err)
	}
	if _, ok := s.StagedVolumes()["v"]; !ok || len(s.PublishedVolumes()["v"]) != 1 {
		t.Error("state lost over the restart")
	}
	if got := s.Connections(); got != 2 {
		t.Errorf("Connections = %d, want 2", got)
	}
	s.Stop()
	if err := s.restart(); err == nil {
		t.Error("Restart after Stop succeeded")
	}
}
