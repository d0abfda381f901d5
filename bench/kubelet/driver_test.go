package kubeletbench

import (
	"context"
	"net"
	"os"
	"sync"
	"sync/atomic"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
)

// driver is an in-process CSI node plugin that does nothing but create and
// remove the target directories, as nodevol's test kit does with
// CreateTargetDirs: the same work on both sides of the comparison.
type driver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedNodeServer
	name     string
	server   *grpc.Server
	accepted atomic.Int64
	calls    atomic.Int64
	mu       sync.Mutex
	staged   map[string]bool
}

// countingListener counts accepted connections (the kubelet's dials).
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

func startDriver(sock, name string) (*driver, error) {
	lis, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	d := &driver{name: name, staged: map[string]bool{}}
	d.server = grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		d.calls.Add(1)
		return h(ctx, req)
	}))
	csi.RegisterIdentityServer(d.server, d)
	csi.RegisterNodeServer(d.server, d)
	go func() { _ = d.server.Serve(countingListener{Listener: lis, n: &d.accepted}) }()
	return d, nil
}

func (d *driver) stop() { d.server.Stop() }

func (d *driver) stagedCount() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.staged)
}

func (d *driver) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: d.name, VendorVersion: "1.0.0"}, nil
}

func (d *driver) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{}, nil
}

func (d *driver) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: "node-1"}, nil
}

func (d *driver) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return &csi.NodeGetCapabilitiesResponse{Capabilities: []*csi.NodeServiceCapability{{
		Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME}},
	}}}, nil
}

func (d *driver) NodeStageVolume(_ context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	d.mu.Lock()
	d.staged[req.GetVolumeId()] = true
	d.mu.Unlock()
	return &csi.NodeStageVolumeResponse{}, nil
}

func (d *driver) NodeUnstageVolume(_ context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	d.mu.Lock()
	delete(d.staged, req.GetVolumeId())
	d.mu.Unlock()
	return &csi.NodeUnstageVolumeResponse{}, nil
}

func (d *driver) NodePublishVolume(_ context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	return &csi.NodePublishVolumeResponse{}, os.MkdirAll(req.GetTargetPath(), 0o750)
}

func (d *driver) NodeUnpublishVolume(_ context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	return &csi.NodeUnpublishVolumeResponse{}, os.RemoveAll(req.GetTargetPath())
}
