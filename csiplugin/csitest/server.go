package csitest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Defaults for Options.
const (
	DefaultDriverName    = "csitest.nodevol.io"
	DefaultNodeID        = "node-1"
	defaultVendorVersion = "0.0.0-csitest"
	// DefaultCapacity is the size every volume reports in NodeGetVolumeStats
	// until NodeExpandVolume grows it.
	DefaultCapacity int64 = 1 << 30
)

// maxSocketPath is the usable length of sun_path on Linux (108 bytes with
// the terminating NUL).
const maxSocketPath = 107

// Options configure a Server. Every field's zero value is the default
// stated on it: the zero Options is a driver named DefaultDriverName on node
// DefaultNodeID that implements STAGE_UNSTAGE_VOLUME and nothing else
// optional.
type Options struct {
	// DriverName is GetPluginInfo's name. Default DefaultDriverName.
	DriverName string
	// VendorVersion is GetPluginInfo's vendor_version. Default
	// "0.0.0-csitest".
	VendorVersion string
	// NodeID is NodeGetInfo's node_id. Default DefaultNodeID.
	NodeID string
	// MaxVolumes is NodeGetInfo's max_volumes_per_node. Default 0: no limit.
	MaxVolumes int64
	// Topology, when not empty, is NodeGetInfo's accessible_topology, and
	// the plugin then reports VOLUME_ACCESSIBILITY_CONSTRAINTS. Default none.
	Topology map[string]string

	// NoStageUnstage drops the STAGE_UNSTAGE_VOLUME node capability:
	// NodeStageVolume and NodeUnstageVolume then fail with Unimplemented and
	// NodePublishVolume ignores staging_target_path. Default false: the
	// driver stages, as most block-backed drivers do.
	NoStageUnstage bool
	// GetVolumeStats reports GET_VOLUME_STATS; without it
	// NodeGetVolumeStats fails with Unimplemented. Default false.
	GetVolumeStats bool
	// Expand reports EXPAND_VOLUME; without it NodeExpandVolume fails with
	// Unimplemented. Default false.
	Expand bool
	// SingleNodeMultiWriter reports SINGLE_NODE_MULTI_WRITER. Default false.
	SingleNodeMultiWriter bool
	// VolumeMountGroup reports VOLUME_MOUNT_GROUP. Default false.
	VolumeMountGroup bool
	// VolumeCondition reports VOLUME_CONDITION (CSI 1.3 to 1.12): each
	// NodeGetVolumeStats answer carries the volume's condition, normal
	// unless SetVolumeCondition says otherwise. Default false.
	VolumeCondition bool
	// VolumeHealth reports GET_VOLUME_HEALTH (CSI 1.13): NodeGetVolumeHealth
	// answers what SetVolumeHealth set. Default false: Unimplemented.
	VolumeHealth bool
	// StorageHealth reports GET_STORAGE_HEALTH (CSI 1.13):
	// NodeGetStorageHealth answers what SetStorageHealth set. Default
	// false: Unimplemented.
	StorageHealth bool

	// CreateTargetDirs makes NodePublishVolume create its target_path (a
	// directory for mount volumes, an empty file for block volumes) and
	// NodeUnpublishVolume remove it, as a real driver does. Paths that
	// already exist are left as they are, so the caller may create them
	// first (mount-utils' FakeMounter flows). Default false: the server
	// touches no file system.
	CreateTargetDirs bool

	// NoRecord stops Requests from recording requests (and cloning them),
	// for benchmarks. Calls, WaitForCalls and Connections still count.
	// Default false: every request is recorded.
	NoRecord bool
}

func (o Options) withDefaults() Options {
	if o.DriverName == "" {
		o.DriverName = DefaultDriverName
	}
	if o.VendorVersion == "" {
		o.VendorVersion = defaultVendorVersion
	}
	if o.NodeID == "" {
		o.NodeID = DefaultNodeID
	}
	// A copy, so that the caller may reuse its map.
	o.Topology = maps.Clone(o.Topology)
	return o
}

// Request is one request the server received.
type Request struct {
	// Method is the RPC's short name, e.g. "NodeStageVolume".
	Method string
	// VolumeID is the request's volume_id, "" for RPCs without one.
	VolumeID string
	// Req is a clone of the request message (e.g. *csi.NodeStageVolumeRequest),
	// taken on arrival. Treat it as read-only: Requests returns the same
	// message to every caller.
	Req proto.Message
	// Time is when the request arrived.
	Time time.Time
}

// Server is an in-process CSI driver serving the Identity, Node and
// (empty) Controller services on a unix socket. It keeps the node's volume
// state in memory and enforces the CSI spec's arguments and ordering like a
// strict driver (see NodeStageVolume and friends in node.go), records every
// request, counts connections, and fails or delays calls on demand (Inject).
// All methods are safe for concurrent use.
type Server struct {
	opts     Options
	endpoint string
	tmpDir   string        // a fallback directory Start made; Stop removes it
	accepted atomic.Int64  // connections accepted, over restarts
	stopped  chan struct{} // closed by Stop; ends held faults
	// maxVolumes is NodeGetInfo's max_volumes_per_node: Options.MaxVolumes
	// until SetMaxVolumes.
	maxVolumes atomic.Int64

	// life serializes Stop and Restart, which replace srv and served.
	life   sync.Mutex
	srv    *grpc.Server
	served chan struct{} // closed when srv.Serve has returned

	mu       sync.Mutex
	requests []Request
	calls    map[string]int
	total    int
	// called is closed and replaced on every request, so that WaitForCalls
	// wakes without polling.
	called  chan struct{}
	faults  []*fault
	volumes map[string]*volume
	// conditions are the volume conditions set by SetVolumeCondition.
	conditions map[string]VolumeCondition
	// volumeHealth and storageHealth are the health conditions set by
	// SetVolumeHealth and SetStorageHealth.
	volumeHealth  map[string][]*csi.VolumeHealth_VolumeHealthEntry
	storageHealth []*csi.NodeGetStorageHealthResponse_StorageBackendHealth
}

// Start serves a new driver on dir/csi.sock. An empty dir, or one whose
// socket path would exceed the 107 bytes a unix socket path may have, is
// replaced by a new directory under /tmp (ShortTempDir) that Stop removes.
// A stale socket file at the path is removed first, so a driver can be
// "restarted" in the same directory. Stop the server when done.
func Start(dir string, opts Options) (*Server, error) {
	s := &Server{
		opts:    opts.withDefaults(),
		stopped: make(chan struct{}),
		calls:   make(map[string]int),
		called:  make(chan struct{}),
		volumes: make(map[string]*volume),
	}
	s.maxVolumes.Store(s.opts.MaxVolumes)
	if dir == "" || len(filepath.Join(dir, "csi.sock")) > maxSocketPath {
		tmp, err := ShortTempDir("csitest-")
		if err != nil {
			return nil, fmt.Errorf("csitest: making a socket directory: %w", err)
		}
		s.tmpDir, dir = tmp, tmp
	}
	s.endpoint = filepath.Join(dir, "csi.sock")
	if len(s.endpoint) > maxSocketPath {
		s.removeTmp()
		return nil, fmt.Errorf("csitest: socket path %q is longer than %d bytes", s.endpoint, maxSocketPath)
	}
	if err := s.serve(); err != nil {
		s.removeTmp()
		return nil, err
	}
	return s, nil
}

// serve listens on the endpoint, replacing a stale socket file, and serves
// on it in a new goroutine. The caller holds s.life or owns s alone.
func (s *Server) serve() error {
	// Only a socket is removed: anything else at the path is a mistake
	// that Listen then reports.
	if fi, err := os.Lstat(s.endpoint); err == nil && fi.Mode()&os.ModeSocket != 0 {
		if err := os.Remove(s.endpoint); err != nil {
			return fmt.Errorf("csitest: removing stale socket: %w", err)
		}
	}
	lis, err := net.Listen("unix", s.endpoint)
	if err != nil {
		return fmt.Errorf("csitest: listening on %s: %w", s.endpoint, err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(s.intercept))
	csi.RegisterIdentityServer(srv, &identityServer{s: s})
	csi.RegisterNodeServer(srv, &nodeServer{s: s})
	csi.RegisterControllerServer(srv, &controllerServer{})
	served := make(chan struct{})
	go func() {
		defer close(served)
		// Serve returns only when Stop or Restart closes the listener;
		// its error then says nothing useful.
		_ = srv.Serve(&countingListener{Listener: lis, accepted: &s.accepted})
	}()
	s.srv, s.served = srv, served
	return nil
}

// New starts a server for a test in a SocketDir and stops it when the
// test ends. It fails the test if the server cannot start.
func New(tb testing.TB, opts Options) *Server {
	tb.Helper()
	s, err := Start(SocketDir(tb), opts)
	if err != nil {
		tb.Fatalf("starting CSI test driver: %v", err)
	}
	tb.Cleanup(s.Stop)
	return s
}

// Stop closes the listener and every connection, ends calls that a fault
// holds (they fail with Unavailable), and removes the socket. It is
// idempotent.
func (s *Server) Stop() {
	s.life.Lock()
	defer s.life.Unlock()
	select {
	case <-s.stopped:
		return
	default:
	}
	close(s.stopped)
	s.srv.Stop()
	<-s.served
	_ = os.Remove(s.endpoint)
	s.removeTmp()
}

// Restart simulates a restart of the driver process that keeps the node's
// state (what is staged and published stays so, as mounts outlive a
// driver): it closes the listener and every connection, which cancels the
// calls in flight, and serves again on the same socket. Recorded requests,
// counts, faults and Connections carry over, so a client that reconnects
// raises Connections by one. It fails after Stop.
func (s *Server) restart() error {
	s.life.Lock()
	defer s.life.Unlock()
	select {
	case <-s.stopped:
		return errors.New("csitest: restart of a stopped server")
	default:
	}
	s.srv.Stop()
	<-s.served
	return s.serve()
}

func (s *Server) removeTmp() {
	if s.tmpDir != "" {
		_ = os.RemoveAll(s.tmpDir)
	}
}

// Endpoint is the path of the server's unix socket (no "unix://" prefix).
func (s *Server) Endpoint() string { return s.endpoint }

// DriverName is the name GetPluginInfo returns.
func (s *Server) DriverName() string { return s.opts.DriverName }

// SetMaxVolumes changes what NodeGetInfo answers as max_volumes_per_node
// from now on: a driver whose attach limit changed.
func (s *Server) SetMaxVolumes(n int64) { s.maxVolumes.Store(n) }

// Connections is the number of connections the server has accepted since it
// started, over restarts. A client that shares one connection for all its calls keeps it
// at 1.
func (s *Server) Connections() int { return int(s.accepted.Load()) }

// Requests returns the requests received since the start or the last
// Reset, oldest first. It is empty when Options.NoRecord is set.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Calls is the number of calls of method (e.g. "NodePublishVolume")
// received since the start or the last Reset; "" counts every method.
// Calls that a fault failed or delayed count too.
func (s *Server) Calls(method string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if method == "" {
		return s.total
	}
	return s.calls[method]
}

// WaitForCalls blocks until Calls(method) is at least n, and returns
// ctx.Err() if ctx ends first. It lets a test wait for a call to arrive
// (for example one that a Fault.Block holds) without sleeping.
func (s *Server) WaitForCalls(ctx context.Context, method string, n int) error {
	for {
		s.mu.Lock()
		got := s.total
		if method != "" {
			got = s.calls[method]
		}
		called := s.called
		s.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-called:
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d %q calls, have %d: %w", n, method, got, ctx.Err())
		}
	}
}

// Reset forgets the recorded requests and zeroes the call counts. It keeps
// the volume state, the faults and the connection count.
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = nil
	s.calls = make(map[string]int)
	s.total = 0
}

// Reboot forgets every staged and published volume, as a node's reboot
// does to a driver's mounts. It keeps the requests, the faults and the
// volumes' capacities.
func (s *Server) Reboot() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range s.volumes {
		v.staged, v.stagingPath, v.stageCap = false, "", nil
		clear(v.published)
	}
}

// StagedVolumes returns the staged volumes: each one's volume ID and the
// staging_target_path it is staged at.
func (s *Server) StagedVolumes() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]string)
	for id, v := range s.volumes {
		if v.staged {
			out[id] = v.stagingPath
		}
	}
	return out
}

// PublishedVolumes returns the volumes published at one target path or
// more: each one's volume ID and its target paths, sorted.
func (s *Server) PublishedVolumes() map[string][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string][]string)
	for id, v := range s.volumes {
		if len(v.published) > 0 {
			out[id] = slices.Sorted(maps.Keys(v.published))
		}
	}
	return out
}

// intercept is where every RPC passes: it counts and records the request,
// then applies the first matching fault, if any, around the handler.
func (s *Server) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	method := info.FullMethod[strings.LastIndexByte(info.FullMethod, '/')+1:]
	var volumeID string
	if r, ok := req.(interface{ GetVolumeId() string }); ok {
		volumeID = r.GetVolumeId()
	}
	f := s.arrive(method, volumeID, req)
	if f == nil {
		return handler(ctx, req)
	}
	waitErr := s.hold(ctx, f)
	var resp any
	var err error
	if f.Commit || (waitErr == nil && f.Err == nil) {
		resp, err = handler(ctx, req)
	}
	switch {
	case waitErr != nil:
		return nil, waitErr
	case f.Err != nil:
		return nil, f.Err
	default:
		return resp, err
	}
}

// arrive counts and records a request and returns the fault to apply to
// it, or nil.
func (s *Server) arrive(method, volumeID string, req any) *Fault {
	var r Request
	if !s.opts.NoRecord {
		// Cloned outside the lock, so that concurrent calls do not wait
		// for each other's copies.
		r = Request{Method: method, VolumeID: volumeID, Time: time.Now()}
		if m, ok := req.(proto.Message); ok {
			r.Req = proto.Clone(m)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[method]++
	s.total++
	close(s.called)
	s.called = make(chan struct{})
	if !s.opts.NoRecord {
		s.requests = append(s.requests, r)
	}
	return s.takeFault(method, volumeID)
}

// countingListener counts accepted connections.
type countingListener struct {
	net.Listener
	accepted *atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

// identityServer implements the CSI Identity service.
type identityServer struct {
	csi.UnimplementedIdentityServer
	s *Server
}

func (i *identityServer) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: i.s.opts.DriverName, VendorVersion: i.s.opts.VendorVersion}, nil
}

func (i *identityServer) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	resp := &csi.GetPluginCapabilitiesResponse{}
	if len(i.s.opts.Topology) > 0 {
		resp.Capabilities = append(resp.Capabilities, &csi.PluginCapability{
			Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{
				Type: csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS,
			}},
		})
	}
	return resp, nil
}

func (i *identityServer) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}

// controllerServer is the Controller service of a driver without a
// controller: it only answers that it has no capabilities, which is what
// nodevol asks when it checks whether a driver attaches.
type controllerServer struct {
	csi.UnimplementedControllerServer
}

func (controllerServer) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	return &csi.ControllerGetCapabilitiesResponse{}, nil
}

// errStopped is what calls that a fault holds return when the server stops.
var errStopped = status.Error(codes.Unavailable, "csitest: server stopped")
