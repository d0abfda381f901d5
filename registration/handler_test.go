package registration

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"

	"github.com/nodevol/nodevol/csi"
	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/pluginmanager"
)

var _ pluginmanager.Handler = (*Handler)(nil)

// regTestDriver is a CSI node service answering NodeGetCapabilities and
// NodeGetInfo.
type regTestDriver struct {
	csipb.UnimplementedNodeServer
	mu      sync.Mutex
	info    *csipb.NodeGetInfoResponse
	infoErr error
	// infoCalls counts NodeGetInfo calls.
	infoCalls int
}

func (d *regTestDriver) NodeGetCapabilities(context.Context, *csipb.NodeGetCapabilitiesRequest) (*csipb.NodeGetCapabilitiesResponse, error) {
	return &csipb.NodeGetCapabilitiesResponse{}, nil
}

func (d *regTestDriver) NodeGetInfo(context.Context, *csipb.NodeGetInfoRequest) (*csipb.NodeGetInfoResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.infoCalls++
	return d.info, d.infoErr
}

// startRegTestDriver serves d on a unix socket until the test ends and
// returns the socket's path.
func startRegTestDriver(t *testing.T, d *regTestDriver) string {
	t.Helper()
	path := filepath.Join(csitest.SocketDir(t), "csi.sock")
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	csipb.RegisterNodeServer(srv, d)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return path
}

func regTestSetup(t *testing.T, withNode bool) (*Handler, *csi.Registry, *fake.Clientset, context.Context) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	client := fake.NewClientset()
	if withNode {
		client = fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", UID: "uid"}})
	}
	reg := csi.NewRegistry(csi.RegistryOptions{})
	t.Cleanup(func() { reg.Close() })
	h, err := New(Config{Registry: reg, KubeClient: client, NodeName: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	return h, reg, client, ctx
}

func TestHighestSupportedVersion(t *testing.T) {
	tests := []struct {
		versions []string
		want     string // "" for an error
	}{
		{[]string{"1.0.0"}, "1.0.0"},
		{[]string{"v1.1.0"}, "1.1.0"},
		{[]string{"0.3.0", "1.2.0", "1.10.0", "2.0.0", "garbage"}, "1.10.0"},
		{nil, ""},
		{[]string{"0.3.0"}, ""},
		{[]string{"2.0.0", "x"}, ""},
	}
	for _, tt := range tests {
		v, err := HighestSupportedVersion(tt.versions)
		switch {
		case tt.want == "" && err == nil:
			t.Errorf("HighestSupportedVersion(%q) = %v, want an error", tt.versions, v)
		case tt.want != "" && (err != nil || v.String() != tt.want):
			t.Errorf("HighestSupportedVersion(%q) = %v, %v; want %s", tt.versions, v, err, tt.want)
		}
	}
}

func TestValidatePluginRefusals(t *testing.T) {
	h, _, _, ctx := regTestSetup(t, true)
	tests := []struct {
		name, endpoint string
		versions       []string
		want           string
	}{
		{"", "/csi.sock", []string{"1.0.0"}, "empty"},
		{"../x", "/csi.sock", []string{"1.0.0"}, "invalid"},
		{strings.Repeat("x", 300), "/csi.sock", []string{"1.0.0"}, "longer than 63"},
		{"a.example.com", "/csi.sock", []string{"0.3.0", "2.0.0"}, "no supported CSI version"},
		{"a.example.com", "/csi.sock", nil, "no supported CSI version"},
		{"a.example.com", "", []string{"1.0.0"}, "empty endpoint"},
	}
	for _, tt := range tests {
		err := h.ValidatePlugin(ctx, tt.name, tt.endpoint, tt.versions)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ValidatePlugin(%.20q, %q, %q) = %v, want %q", tt.name, tt.endpoint, tt.versions, err, tt.want)
		}
		if err := h.RegisterPlugin(ctx, tt.name, tt.endpoint, tt.versions); err == nil {
			t.Errorf("RegisterPlugin(%.20q) = nil, want the refusal", tt.name)
		}
	}
}

func TestRegisterAndDeregisterPlugin(t *testing.T) {
	h, reg, client, ctx := regTestSetup(t, true)
	d := &regTestDriver{info: &csipb.NodeGetInfoResponse{
		NodeId: "n1", MaxVolumesPerNode: 5,
		AccessibleTopology: &csipb.Topology{Segments: map[string]string{"topology.example.com/zone": "z"}},
	}}
	endpoint := startRegTestDriver(t, d)
	versions := []string{"1.5.0"}
	if err := h.ValidatePlugin(ctx, "a.example.com", endpoint, versions); err != nil {
		t.Fatal(err)
	}
	if err := h.RegisterPlugin(ctx, "a.example.com", endpoint, versions); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Client("a.example.com"); err != nil {
		t.Fatalf("driver not in the registry: %v", err)
	}
	node, _ := client.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
	if node.Annotations[NodeIDAnnotation] != `{"a.example.com":"n1"}` || node.Labels["topology.example.com/zone"] != "z" {
		t.Errorf("node annotations %v labels %v", node.Annotations, node.Labels)
	}
	cn, err := client.StorageV1().CSINodes().Get(ctx, "node-1", metav1.GetOptions{})
	if err != nil || len(cn.Spec.Drivers) != 1 || *cn.Spec.Drivers[0].Allocatable.Count != 5 {
		t.Fatalf("CSINode = %+v, %v", cn, err)
	}

	// A second registrar claiming the name at an equal or lower version is
	// refused; a higher version would replace the driver.
	for _, v := range []string{"1.5.0", "1.0.0"} {
		if err := h.ValidatePlugin(ctx, "a.example.com", "/other.sock", []string{v}); err == nil || !strings.Contains(err.Error(), "already registered") {
			t.Errorf("ValidatePlugin of a second registrar at %s = %v, want a refusal", v, err)
		}
	}
	if err := h.ValidatePlugin(ctx, "a.example.com", "/other.sock", []string{"1.6.0"}); err != nil {
		t.Errorf("ValidatePlugin at a higher version = %v, want nil", err)
	}

	// Deregistration from another endpoint does not touch the driver.
	if err := h.DeRegisterPlugin(ctx, "a.example.com", "/other.sock"); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Client("a.example.com"); err != nil {
		t.Fatalf("driver deregistered by another endpoint: %v", err)
	}
	if err := h.DeRegisterPlugin(ctx, "a.example.com", endpoint); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Client("a.example.com"); err == nil {
		t.Error("driver still in the registry")
	}
	node, _ = client.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
	cn, _ = client.StorageV1().CSINodes().Get(ctx, "node-1", metav1.GetOptions{})
	if _, ok := node.Annotations[NodeIDAnnotation]; ok || len(cn.Spec.Drivers) != 0 {
		t.Errorf("driver still recorded: annotations %v, CSINode drivers %+v", node.Annotations, cn.Spec.Drivers)
	}
	// The name is free again.
	if err := h.ValidatePlugin(ctx, "a.example.com", endpoint, versions); err != nil {
		t.Errorf("ValidatePlugin after deregistration = %v", err)
	}
}

func TestRegisterPluginRollsBack(t *testing.T) {
	tests := []struct {
		name     string
		withNode bool
		driver   *regTestDriver
		want     string
	}{
		{"NodeGetInfo fails", true, &regTestDriver{infoErr: status.Error(codes.Internal, "broken")}, "broken"},
		{"empty node ID", true, &regTestDriver{info: &csipb.NodeGetInfoResponse{}}, "empty node ID"},
		{"no Node object", false, &regTestDriver{info: &csipb.NodeGetInfoResponse{NodeId: "n1"}}, "not found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, reg, _, ctx := regTestSetup(t, tt.withNode)
			endpoint := startRegTestDriver(t, tt.driver)
			err := h.RegisterPlugin(ctx, "a.example.com", endpoint, []string{"1.0.0"})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("RegisterPlugin = %v, want %q", err, tt.want)
			}
			if len(reg.Drivers()) != 0 {
				t.Errorf("registry still has %q", reg.Drivers())
			}
			if err := h.ValidatePlugin(ctx, "a.example.com", endpoint, []string{"1.0.0"}); err != nil {
				t.Errorf("ValidatePlugin after a failed registration = %v, want nil", err)
			}
		})
	}
}

func TestRegisterPluginUnreachableEndpoint(t *testing.T) {
	h, reg, _, ctx := regTestSetup(t, true)
	ctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	err := h.RegisterPlugin(ctx, "a.example.com", "/nonexistent/csi.sock", []string{"1.0.0"})
	if err == nil {
		t.Fatal("RegisterPlugin on a missing socket = nil")
	}
	if len(reg.Drivers()) != 0 {
		t.Errorf("registry has %q", reg.Drivers())
	}
}

// TestNewRegistrationHandler: New checks its configuration, and without a
// KubeClient Run returns at once and only the registry is updated.
func TestNewRegistrationHandler(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Error("no registry: want an error")
	}
	reg := csi.NewRegistry(csi.RegistryOptions{})
	defer reg.Close()
	if _, err := New(Config{Registry: reg, KubeClient: fake.NewClientset()}); err == nil {
		t.Error("KubeClient without NodeName: want an error")
	}
	h, err := New(Config{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := h.Run(ctx); err != nil {
		t.Errorf("Run without a KubeClient = %v", err)
	}
	if err := h.ValidatePlugin(ctx, "bad name!", "/nowhere.sock", []string{"1.0.0"}); err == nil {
		t.Error("ValidatePlugin accepted an invalid driver name")
	}
	// Without a KubeClient only the registry is updated.
	endpoint := startRegTestDriver(t, &regTestDriver{info: &csipb.NodeGetInfoResponse{NodeId: "n1"}})
	if err := h.RegisterPlugin(ctx, "a.example.com", endpoint, []string{"1.0.0"}); err != nil {
		t.Fatal(err)
	}
	if err := h.DeRegisterPlugin(ctx, "a.example.com", endpoint); err != nil {
		t.Fatal(err)
	}
	if len(reg.Drivers()) != 0 {
		t.Errorf("registry has %q", reg.Drivers())
	}
}
