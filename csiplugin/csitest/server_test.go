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
	"google.golang.org/grpc/codes"
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
	conn, err := s.Dial()
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

// step is one call in a scenario and the code it must return.
type step struct {
	call func(c *client) error
	want codes.Code
	// msg, when set, must appear in the error message.
	msg string
}

func TestNodeOrderingAndValidation(t *testing.T) {
	const v, st, tp, tp2 = "vol-1", "/staging/a", "/pods/1/mount", "/pods/2/mount"
	stage := func(vol, path string, vc *csi.VolumeCapability) func(*client) error {
		return func(c *client) error { return c.stage(vol, path, vc) }
	}
	unstage := func(vol, path string) func(*client) error {
		return func(c *client) error { return c.unstage(vol, path) }
	}
	publish := func(vol, staging, target string, vc *csi.VolumeCapability, ro bool) func(*client) error {
		return func(c *client) error { return c.publish(vol, staging, target, vc, ro) }
	}
	unpublish := func(vol, target string) func(*client) error {
		return func(c *client) error { return c.unpublish(vol, target) }
	}
	noMode := &csi.VolumeCapability{AccessType: mountCap().AccessType}
	noType := &csi.VolumeCapability{AccessMode: mountCap().AccessMode}
	tests := []struct {
		name  string
		opts  Options
		steps []step
		// staged and published describe v's state at the end.
		staged    string
		published []string
	}{{
		name: "stage, publish twice, unpublish, unstage",
		steps: []step{
			{call: stage(v, st, mountCap())},
			{call: publish(v, st, tp, mountCap(), false)},
			{call: publish(v, st, tp2, mountCap(), true)},
			{call: unpublish(v, tp)},
			{call: unpublish(v, tp2)},
			{call: unstage(v, st)},
		},
	}, {
		name: "repeats with the same arguments succeed",
		steps: []step{
			{call: stage(v, st, mountCap())},
			{call: stage(v, st, mountCap())},
			{call: publish(v, st, tp, mountCap(), false)},
			{call: publish(v, st, tp, mountCap(), false)},
		},
		staged: st, published: []string{tp},
	}, {
		name: "missing fields name the field",
		steps: []step{
			{call: stage("", st, mountCap()), want: codes.InvalidArgument, msg: "volume_id"},
			{call: stage(v, "", mountCap()), want: codes.InvalidArgument, msg: "staging_target_path"},
			{call: stage(v, st, nil), want: codes.InvalidArgument, msg: "volume_capability"},
			{call: stage(v, st, noMode), want: codes.InvalidArgument, msg: "access_mode"},
			{call: stage(v, st, noType), want: codes.InvalidArgument, msg: "access_type"},
			{call: unstage("", st), want: codes.InvalidArgument, msg: "volume_id"},
			{call: unstage(v, ""), want: codes.InvalidArgument, msg: "staging_target_path"},
			{call: publish("", st, tp, mountCap(), false), want: codes.InvalidArgument, msg: "volume_id"},
			{call: publish(v, st, "", mountCap(), false), want: codes.InvalidArgument, msg: "target_path"},
			{call: publish(v, "", tp, mountCap(), false), want: codes.InvalidArgument, msg: "staging_target_path"},
			{call: publish(v, st, tp, nil, false), want: codes.InvalidArgument, msg: "volume_capability"},
			{call: unpublish("", tp), want: codes.InvalidArgument, msg: "volume_id"},
			{call: unpublish(v, ""), want: codes.InvalidArgument, msg: "target_path"},
		},
	}, {
		name: "publish before stage fails",
		steps: []step{
			{call: publish(v, st, tp, mountCap(), false), want: codes.FailedPrecondition},
		},
	}, {
		name: "publish from another staging path fails",
		steps: []step{
			{call: stage(v, st, mountCap())},
			{call: publish(v, "/staging/b", tp, mountCap(), false), want: codes.FailedPrecondition},
		},
		staged: st,
	}, {
		name: "unstage while published fails",
		steps: []step{
			{call: stage(v, st, mountCap())},
			{call: publish(v, st, tp, mountCap(), false)},
			{call: unstage(v, st), want: codes.FailedPrecondition},
		},
		staged: st, published: []string{tp},
	}, {
		name: "stage at another path or with another capability fails",
		steps: []step{
			{call: stage(v, st, mountCap())},
			{call: stage(v, "/staging/b", mountCap()), want: codes.AlreadyExists},
			{call: stage(v, st, blockCap()), want: codes.AlreadyExists},
		},
		staged: st,
	}, {
		name: "publish again with other arguments fails",
		steps: []step{
			{call: stage(v, st, mountCap())},
			{call: publish(v, st, tp, mountCap(), false)},
			{call: publish(v, st, tp, mountCap(), true), want: codes.AlreadyExists},
			{call: publish(v, st, tp, blockCap(), false), want: codes.AlreadyExists},
		},
		staged: st, published: []string{tp},
	}, {
		name: "unpublish and unstage of unknown volumes or paths succeed",
		steps: []step{
			{call: unpublish("nothing", tp)},
			{call: unstage("nothing", st)},
			{call: stage(v, st, mountCap())},
			{call: unstage(v, "/staging/other")},
			{call: publish(v, st, tp, mountCap(), false)},
			{call: unpublish(v, tp2)},
		},
		staged: st, published: []string{tp},
	}, {
		name: "without STAGE_UNSTAGE, publish needs no staging and stage is unimplemented",
		opts: Options{NoStageUnstage: true},
		steps: []step{
			{call: stage(v, st, mountCap()), want: codes.Unimplemented},
			{call: unstage(v, st), want: codes.Unimplemented},
			{call: publish(v, "", tp, mountCap(), false)},
			{call: publish(v, "", tp, mountCap(), false)},
		},
		published: []string{tp},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := New(t, tt.opts)
			c := dial(t, s)
			for i, st := range tt.steps {
				err := st.call(c)
				if got := status.Code(err); got != st.want {
					t.Fatalf("step %d: got %v (%v), want %v", i, got, err, st.want)
				}
				if st.msg != "" && !strings.Contains(status.Convert(err).Message(), st.msg) {
					t.Errorf("step %d: error %q does not name %q", i, err, st.msg)
				}
			}
			path, ok := s.Staged(v)
			if path != tt.staged || ok != (tt.staged != "") {
				t.Errorf("Staged = %q, %v; want %q", path, ok, tt.staged)
			}
			if got := s.Published(v); strings.Join(got, ",") != strings.Join(tt.published, ",") {
				t.Errorf("Published = %v, want %v", got, tt.published)
			}
		})
	}
}

func TestStateQueries(t *testing.T) {
	s := New(t, Options{})
	c := dial(t, s)
	for _, v := range []string{"b", "a", "c"} {
		if err := c.stage(v, "/st/"+v, mountCap()); err != nil {
			t.Fatal(err)
		}
	}
	for _, target := range []string{"/p/2", "/p/1"} {
		if err := c.publish("a", "/st/a", target, mountCap(), false); err != nil {
			t.Fatal(err)
		}
	}
	if got := strings.Join(s.StagedVolumes(), ","); got != "a,b,c" {
		t.Errorf("StagedVolumes = %s", got)
	}
	if got := strings.Join(s.PublishedVolumes(), ","); got != "a" {
		t.Errorf("PublishedVolumes = %s", got)
	}
	if got := strings.Join(s.Published("a"), ","); got != "/p/1,/p/2" {
		t.Errorf("Published(a) = %s", got)
	}
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

func TestStatsAndExpand(t *testing.T) {
	s := New(t, Options{GetVolumeStats: true, Expand: true})
	c := dial(t, s)
	ctx := ctxFor(t)
	if _, err := c.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "v", VolumePath: "/p"}); status.Code(err) != codes.NotFound {
		t.Errorf("stats of an unknown volume: %v, want NotFound", err)
	}
	if err := c.stage("v", "/st", mountCap()); err != nil {
		t.Fatal(err)
	}
	if err := c.publish("v", "/st", "/p", mountCap(), false); err != nil {
		t.Fatal(err)
	}
	st, err := c.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "v", VolumePath: "/p"})
	if err != nil || len(st.GetUsage()) != 2 || st.GetUsage()[0].GetTotal() != DefaultCapacity {
		t.Fatalf("stats = %v, %v", st, err)
	}
	if u := st.GetUsage()[0]; u.GetUsed()+u.GetAvailable() != u.GetTotal() {
		t.Errorf("implausible usage %v", u)
	}
	ex, err := c.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{
		VolumeId: "v", VolumePath: "/p", CapacityRange: &csi.CapacityRange{RequiredBytes: 2 << 30},
	})
	if err != nil || ex.GetCapacityBytes() != 2<<30 {
		t.Fatalf("expand = %v, %v", ex, err)
	}
	st, err = c.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "v", VolumePath: "/st"})
	if err != nil || st.GetUsage()[0].GetTotal() != 2<<30 {
		t.Errorf("stats after expand = %v, %v", st, err)
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
		if _, ok := s.Staged("v1"); ok {
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
		if _, ok := s.Staged("v"); ok {
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
		if _, ok := s.Staged("v"); !ok {
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
		if _, ok := s.Staged("v"); ok {
			t.Error("staged while held")
		}
		close(release)
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		if _, ok := s.Staged("v"); !ok {
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
		if _, ok := s.Staged("v"); !ok {
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
	short := t.TempDir()
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
}

func TestCreateTargetDirs(t *testing.T) {
	s := New(t, Options{CreateTargetDirs: true})
	c := dial(t, s)
	root := t.TempDir()
	mnt := filepath.Join(root, "pods", "1", "mount")
	dev := filepath.Join(root, "block", "publish", "1")
	if err := c.stage("v", "/st", mountCap()); err != nil {
		t.Fatal(err)
	}
	if err := c.publish("v", "/st", mnt, mountCap(), false); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(mnt); err != nil || !fi.IsDir() {
		t.Errorf("mount target: %v, %v", fi, err)
	}
	if err := c.stage("b", "/stb", blockCap()); err != nil {
		t.Fatal(err)
	}
	if err := c.publish("b", "/stb", dev, blockCap(), false); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dev); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("block target: %v, %v", fi, err)
	}
	// A target the caller made first (FakeMounter flows) is fine.
	pre := filepath.Join(root, "pods", "2", "mount")
	if err := os.MkdirAll(pre, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := c.publish("v", "/st", pre, mountCap(), false); err != nil {
		t.Fatal(err)
	}
	for vol, p := range map[string]string{"v": mnt, "b": dev} {
		if err := c.unpublish(vol, p); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s not removed: %v", p, err)
		}
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
