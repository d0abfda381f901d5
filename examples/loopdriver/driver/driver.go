package driver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"
)

// DefaultDriverName is the CSI driver name used when options.DriverName
// is empty.
const DefaultDriverName = "loop.csi.nodevol.io"

// defaultMaxVolumes is NodeGetInfo's max_volumes_per_node when
// options.MaxVolumes is zero.
const defaultMaxVolumes = 64

// defaultDetachTimeout is how long a call waits, by default, for the
// kernel to finish detaching a loop device that something else still
// has open (see options.DetachTimeout).
const defaultDetachTimeout = 10 * time.Second

// version is reported by GetPluginInfo.
const version = "0.1.0"

// options configures a server (newServer). NodeID and StateDir are required; every
// other field has the default its comment gives.
type options struct {
	// DriverName is the CSI driver name; default DefaultDriverName.
	DriverName string
	// NodeID is this node's ID, returned by NodeGetInfo and the only node
	// ControllerPublishVolume accepts. Required.
	NodeID string
	// StateDir holds the volume images and state files. It is created if
	// missing. Required.
	StateDir string
	// MaxVolumes is max_volumes_per_node; default 64.
	// ControllerPublishVolume refuses to publish more to the node.
	MaxVolumes int64
	// Mounter does the mounts; default mount.NewWithoutSystemd("").
	Mounter mount.Interface
	// Exec runs mkfs, blkid, resize2fs and losetup; default exec.New().
	Exec utilexec.Interface
	// Loop attaches images to loop devices; default losetup(8) run
	// through Exec.
	Loop loopDevices
	// DetachTimeout bounds how long NodeUnstageVolume, NodeStageVolume
	// and DeleteVolume wait for a detached loop device to go away: the
	// kernel detaches a device that something else still has open only
	// at its last close. Past it (or the RPC's deadline) they fail with
	// Unavailable and a retry waits again. Default 10s.
	DetachTimeout time.Duration
	// Faults are injected failures (see fault); default none.
	Faults []fault
	// FaultHook, if set, is called at every fault point before Faults:
	// at atStart of every RPC and atMid of the RPCs that have one. A
	// non-nil error fails the RPC with it (use a gRPC status error to
	// choose the code). Default none.
	FaultHook func(ctx context.Context, method, volumeID string, at faultPoint) error
	// Exit ends the process for an Exit fault; default os.Exit.
	Exit func(code int)
	// CallLog, if set, gets one line per Node service RPC as it arrives
	// (before faults and before it runs), for tests that count what a CO
	// sent: method, volume ID, target path and staging target path
	// (volume path for NodeExpandVolume and NodeGetVolumeStats),
	// tab-separated, "-" for an empty field. Default none.
	CallLog io.Writer
}

// server is the driver: it implements the three CSI services, each RPC a
// method of it. It keeps each volume as a sparse image file and attaches it
// on the node through a loop device. It is safe for concurrent use;
// operations on one volume are serialized, operations on different volumes
// run in parallel.
type server struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
	csi.UnimplementedNodeServer

	name, nodeID string
	maxVolumes   int64
	stateDir     string
	topology     map[string]string

	store   *store
	snaps   *snapshotStore
	mounter *mount.SafeFormatAndMount
	exec    utilexec.Interface
	loop    loopDevices
	// detachWait is options.DetachTimeout.
	detachWait time.Duration
	faults     *faults
	locks      keyedMutex

	callLogMu sync.Mutex
	callLog   io.Writer
}

var (
	_ csi.IdentityServer   = (*server)(nil)
	_ csi.ControllerServer = (*server)(nil)
	_ csi.NodeServer       = (*server)(nil)
)

// newServer checks cfg, fills in its defaults and loads the state
// directory. It fails, naming the file, if a state file is corrupt or of
// an unknown version.
func newServer(cfg options) (*server, error) {
	if cfg.DriverName == "" {
		cfg.DriverName = DefaultDriverName
	}
	if err := validateDriverName(cfg.DriverName); err != nil {
		return nil, err
	}
	if cfg.NodeID == "" {
		return nil, errors.New("loop driver: node ID is required")
	}
	if cfg.StateDir == "" {
		return nil, errors.New("loop driver: state directory is required")
	}
	stateDir, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("loop driver: state directory: %w", err)
	}
	if cfg.MaxVolumes < 0 {
		return nil, fmt.Errorf("loop driver: max volumes %d is negative", cfg.MaxVolumes)
	}
	if cfg.MaxVolumes == 0 {
		cfg.MaxVolumes = defaultMaxVolumes
	}
	if cfg.Mounter == nil {
		cfg.Mounter = mount.NewWithoutSystemd("")
	}
	if cfg.Exec == nil {
		cfg.Exec = utilexec.New()
	}
	if cfg.Loop == nil {
		cfg.Loop = losetup{exec: cfg.Exec}
	}
	if cfg.DetachTimeout < 0 {
		return nil, fmt.Errorf("loop driver: detach timeout %v is negative", cfg.DetachTimeout)
	}
	if cfg.DetachTimeout == 0 {
		cfg.DetachTimeout = defaultDetachTimeout
	}
	if cfg.Exit == nil {
		cfg.Exit = os.Exit
	}
	st, err := openStore(stateDir)
	if err != nil {
		return nil, fmt.Errorf("loop driver: %w", err)
	}
	snaps, err := openSnapshotStore(stateDir)
	if err != nil {
		return nil, fmt.Errorf("loop driver: %w", err)
	}
	return &server{
		name:       cfg.DriverName,
		nodeID:     cfg.NodeID,
		maxVolumes: cfg.MaxVolumes,
		stateDir:   stateDir,
		topology:   map[string]string{topologyKey(cfg.DriverName): cfg.NodeID},
		store:      st,
		snaps:      snaps,
		mounter:    mount.NewSafeFormatAndMount(cfg.Mounter, cfg.Exec),
		exec:       cfg.Exec,
		loop:       cfg.Loop,
		detachWait: cfg.DetachTimeout,
		callLog:    cfg.CallLog,
		faults: &faults{
			hook:  cfg.FaultHook,
			exit:  cfg.Exit,
			list:  cfg.Faults,
			fired: make([]int, len(cfg.Faults)),
		},
	}, nil
}

// topologyKey is the topology segment key naming the node a volume is
// accessible from, e.g. topology.loop.csi.nodevol.io/node.
func topologyKey(driverName string) string { return "topology." + driverName + "/node" }

// validateDriverName applies the CSI spec's rules for plugin names.
func validateDriverName(name string) error {
	if len(name) > 63 {
		return fmt.Errorf("loop driver: driver name %q is longer than 63 characters", name)
	}
	for i, r := range name {
		alnum := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
		if !alnum && (i == 0 || i == len(name)-1 || !strings.ContainsRune("-_.", r)) {
			return fmt.Errorf("loop driver: driver name %q: must be alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric", name)
		}
	}
	return nil
}

// grpcServer returns a gRPC server with the driver's three services
// registered, logging and fault injection wired in.
func (d *server) grpcServer() *grpc.Server {
	srv := grpc.NewServer(grpc.UnaryInterceptor(d.intercept))
	csi.RegisterIdentityServer(srv, d)
	csi.RegisterControllerServer(srv, d)
	csi.RegisterNodeServer(srv, d)
	return srv
}

// serve serves the driver on lis until ctx ends, then stops gracefully
// (waiting up to 10 seconds for running RPCs) and returns nil. It returns
// an error if serving fails. lis is closed either way.
func (d *server) serve(ctx context.Context, lis net.Listener) error {
	srv := d.grpcServer()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	select {
	case err := <-errc:
		return fmt.Errorf("loop driver: serving on %s: %w", lis.Addr(), err)
	case <-ctx.Done():
	}
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		srv.Stop()
	}
	<-errc
	return nil
}

// run listens on endpoint (unix:///path/to.sock or a plain path),
// removing a stale socket file first, and serves until ctx ends; then it
// removes the socket.
func (d *server) run(ctx context.Context, endpoint string) error {
	path, err := parseEndpoint(endpoint)
	if err != nil {
		return err
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return fmt.Errorf("loop driver: endpoint %s exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("loop driver: removing stale socket: %w", err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return fmt.Errorf("loop driver: creating socket directory: %w", err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("loop driver: %w", err)
	}
	defer os.Remove(path)
	klog.FromContext(ctx).Info("Serving CSI", "driver", d.name, "node", d.nodeID, "endpoint", path, "stateDir", d.stateDir)
	return d.serve(ctx, lis)
}

// parseEndpoint returns the socket path of a unix:// endpoint or a plain
// path. Other schemes are refused: the driver only serves on this node.
func parseEndpoint(endpoint string) (string, error) {
	path := endpoint
	if rest, ok := strings.CutPrefix(endpoint, "unix://"); ok {
		path = rest
	} else if strings.Contains(endpoint, "://") {
		return "", fmt.Errorf("loop driver: endpoint %q: only unix:// endpoints are supported", endpoint)
	}
	if path == "" {
		return "", fmt.Errorf("loop driver: endpoint %q has no path", endpoint)
	}
	return filepath.Clean(path), nil
}

// volumeIDGetter is implemented by every request that names a volume.
type volumeIDGetter interface{ GetVolumeId() string }

// intercept logs each RPC (never its secrets: only the method, volume ID
// and outcome) and fires the atStart faults, and the atMid faults of the
// RPCs that have no mid point of their own.
func (d *server) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	method := info.FullMethod[strings.LastIndexByte(info.FullMethod, '/')+1:]
	var volID string
	if r, ok := req.(volumeIDGetter); ok {
		volID = r.GetVolumeId()
	}
	logger := klog.FromContext(ctx).WithValues("method", method)
	if volID != "" {
		logger = logger.WithValues("volumeID", volID)
	}
	ctx = klog.NewContext(ctx, logger)
	d.logCall(method, volID, req)
	start := time.Now()
	resp, err := d.runFaulted(ctx, method, volID, req, handler)
	if err != nil {
		logger.Error(err, "CSI call failed", "code", status.Code(err), "duration", time.Since(start))
	} else {
		logger.V(4).Info("CSI call done", "duration", time.Since(start))
	}
	return resp, err
}

// logCall writes the call log's line for a Node service RPC (see
// options.CallLog). A failed write is logged, never returned.
func (d *server) logCall(method, volID string, req any) {
	if d.callLog == nil || !strings.HasPrefix(method, "Node") {
		return
	}
	var target, staging string
	if r, ok := req.(interface{ GetTargetPath() string }); ok {
		target = r.GetTargetPath()
	}
	if r, ok := req.(interface{ GetVolumePath() string }); ok {
		target = r.GetVolumePath()
	}
	if r, ok := req.(interface{ GetStagingTargetPath() string }); ok {
		staging = r.GetStagingTargetPath()
	}
	field := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	line := method + "\t" + field(volID) + "\t" + field(target) + "\t" + field(staging) + "\n"
	d.callLogMu.Lock()
	defer d.callLogMu.Unlock()
	if _, err := io.WriteString(d.callLog, line); err != nil {
		klog.Background().Error(err, "Writing the call log")
	}
}

func (d *server) runFaulted(ctx context.Context, method, volID string, req any, handler grpc.UnaryHandler) (any, error) {
	if err := d.faults.fire(ctx, method, volID, atStart); err != nil {
		return nil, err
	}
	if !midMethods[method] {
		if err := d.faults.fire(ctx, method, volID, atMid); err != nil {
			return nil, err
		}
	}
	return handler(ctx, req)
}

// midMethods are the RPCs that call d.mid part way through.
var midMethods = map[string]bool{
	"CreateVolume": true, "ControllerExpandVolume": true,
	"NodeStageVolume": true, "NodeUnstageVolume": true,
	"NodePublishVolume": true, "NodeUnpublishVolume": true,
	"NodeExpandVolume": true,
}

// mid fires the atMid faults of method for volume id.
func (d *server) mid(ctx context.Context, method, id string) error {
	return d.faults.fire(ctx, method, id, atMid)
}

// keyedMutex serializes work per key (volume ID); different keys do not
// wait for each other.
type keyedMutex struct {
	mu    sync.Mutex
	locks map[string]*keyLock
}

type keyLock struct {
	ch   chan struct{} // holds a token while the key is locked
	refs int
}

// lock waits for key, or for ctx to end, and returns the unlock function.
func (k *keyedMutex) lock(ctx context.Context, key string) (func(), error) {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*keyLock{}
	}
	l := k.locks[key]
	if l == nil {
		l = &keyLock{ch: make(chan struct{}, 1)}
		k.locks[key] = l
	}
	l.refs++
	k.mu.Unlock()

	release := func() {
		k.mu.Lock()
		l.refs--
		if l.refs == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
	select {
	case l.ch <- struct{}{}:
		return func() { <-l.ch; release() }, nil
	case <-ctx.Done():
		release()
		return nil, status.Errorf(codes.Aborted, "volume %s: waiting for another operation on it: %v", key, ctx.Err())
	}
}

// lockVolume takes the per-volume lock of id for one RPC.
func (d *server) lockVolume(ctx context.Context, id string) (func(), error) {
	return d.locks.lock(ctx, id)
}
