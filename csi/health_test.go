package csi

import (
	"context"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// healthClient registers a csitest driver with opts and returns its client.
func healthClient(t *testing.T, opts csitest.Options) (*csitest.Server, *Client) {
	t.Helper()
	srv := csitest.New(t, opts)
	r := NewRegistry(RegistryOptions{})
	t.Cleanup(func() { _ = r.Close() })
	if err := r.Register(context.Background(), drv, srv.Endpoint()); err != nil {
		t.Fatal(err)
	}
	c, err := r.Client(drv)
	if err != nil {
		t.Fatal(err)
	}
	return srv, c
}

func volEntry(s csipb.VolumeHealthErrorType, reason, msg string) *csipb.VolumeHealth_VolumeHealthEntry {
	return &csipb.VolumeHealth_VolumeHealthEntry{Status: s, Reason: reason, Message: msg}
}

func storageEntry(s csipb.StorageHealthErrorType, reason string, vc *csipb.VolumeCapability) *csipb.NodeGetStorageHealthResponse_StorageBackendHealth {
	return &csipb.NodeGetStorageHealthResponse_StorageBackendHealth{Status: s, Reason: reason, Message: "m " + reason, VolumeCapability: vc}
}

func capability(block bool, mode csipb.VolumeCapability_AccessMode_Mode) *csipb.VolumeCapability {
	vc := &csipb.VolumeCapability{AccessMode: &csipb.VolumeCapability_AccessMode{Mode: mode}}
	if block {
		vc.AccessType = &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}}
	} else {
		vc.AccessType = &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}}
	}
	return vc
}

// TestNodeGetVolumeHealth: the capabilities are read from
// NodeGetCapabilities; the request carries the volume ID and both paths;
// the answer's entries become API conditions, unknown types left out and
// duplicates of a (status, reason) kept once; too many are an error; a
// driver without the capability is not called.
func TestNodeGetVolumeHealth(t *testing.T) {
	ctx := context.Background()
	srv, c := healthClient(t, csitest.Options{VolumeHealth: true})
	if caps := c.Capabilities(); !caps.VolumeHealth || caps.StorageHealth {
		t.Fatalf("Capabilities = %+v", caps)
	}
	srv.SetVolumeHealth("h",
		volEntry(csipb.VolumeHealthErrorType_DEGRADED, "PathDown", "one of two paths down"),
		volEntry(csipb.VolumeHealthErrorType_UNKNOWN_VOLUME_HEALTH_TYPE, "Unset", ""),
		volEntry(csipb.VolumeHealthErrorType(42), "FromTheFuture", ""),
		volEntry(csipb.VolumeHealthErrorType_INACCESSIBLE, "NoPath", ""),
		volEntry(csipb.VolumeHealthErrorType_DEGRADED, "PathDown", "said twice"),
		volEntry(csipb.VolumeHealthErrorType_DATA_LOSS, "Corrupt", "checksum"))
	got, err := c.NodeGetVolumeHealth(ctx, VolumeHealthRequest{VolumeID: "h", StagingPath: "/s", PublishPath: "/p"})
	if err != nil {
		t.Fatal(err)
	}
	want := []v1.VolumeHealthCondition{
		{Status: v1.VolumeHealthDegraded, Reason: "PathDown", Message: "one of two paths down"},
		{Status: v1.VolumeHealthInaccessible, Reason: "NoPath"},
		{Status: v1.VolumeHealthDataLoss, Reason: "Corrupt", Message: "checksum"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("conditions (-want +got):\n%s", diff)
	}
	reqs := srv.Requests()
	last := reqs[len(reqs)-1].Req.(*csipb.NodeGetVolumeHealthRequest)
	if last.GetVolumeId() != "h" || last.GetStagingTargetPath() != "/s" || last.GetVolumePublishPath() != "/p" {
		t.Errorf("request %v", last)
	}

	srv.SetVolumeHealth("h")
	if got, err := c.NodeGetVolumeHealth(ctx, VolumeHealthRequest{VolumeID: "h"}); err != nil || len(got) != 0 {
		t.Errorf("healthy volume: %v, %v", got, err)
	}
	if _, err := c.NodeGetVolumeHealth(ctx, VolumeHealthRequest{VolumeID: "unknown"}); status.Code(err) != codes.NotFound {
		t.Errorf("unknown volume: %v, want NotFound", err)
	}
	many := make([]*csipb.VolumeHealth_VolumeHealthEntry, maxHealthConditions+1)
	for i := range many {
		many[i] = volEntry(csipb.VolumeHealthErrorType_DEGRADED, strings.Repeat("R", i+1), "")
	}
	srv.SetVolumeHealth("h", many...)
	if _, err := c.NodeGetVolumeHealth(ctx, VolumeHealthRequest{VolumeID: "h"}); err == nil || !strings.Contains(err.Error(), "17 conditions") {
		t.Errorf("17 conditions: %v", err)
	}

	plain, pc := healthClient(t, csitest.Options{})
	if _, err := pc.NodeGetVolumeHealth(ctx, VolumeHealthRequest{VolumeID: "h"}); err == nil {
		t.Error("a driver without GET_VOLUME_HEALTH was asked")
	}
	if _, err := pc.NodeGetStorageHealth(ctx); err == nil {
		t.Error("a driver without GET_STORAGE_HEALTH was asked")
	}
	if n := plain.Calls("NodeGetVolumeHealth") + plain.Calls("NodeGetStorageHealth"); n != 0 {
		t.Errorf("%d health calls to a driver without the capabilities", n)
	}
}

// TestNodeGetStorageHealth maps each answer of the driver as the kubelet
// does: statuses, volume capabilities to access and volume modes, unknown
// statuses left out, and refuses a capability without access type or
// mode and more than 16 conditions.
func TestNodeGetStorageHealth(t *testing.T) {
	rwo, rwop, rox, rwx := v1.ReadWriteOnce, v1.ReadWriteOncePod, v1.ReadOnlyMany, v1.ReadWriteMany
	fs, block := v1.PersistentVolumeFilesystem, v1.PersistentVolumeBlock
	unreachable, degraded := csipb.StorageHealthErrorType_STORAGE_UNREACHABLE, csipb.StorageHealthErrorType_STORAGE_DEGRADED
	tests := []struct {
		name    string
		entries []*csipb.NodeGetStorageHealthResponse_StorageBackendHealth
		want    []storagev1.StorageHealthCondition
		wantErr string
	}{
		{name: "healthy"},
		{name: "all modes", entries: []*csipb.NodeGetStorageHealthResponse_StorageBackendHealth{
			storageEntry(unreachable, "Down", nil),
			storageEntry(degraded, "SNW", capability(false, csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)),
			storageEntry(degraded, "SNSW", capability(true, csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER)),
			storageEntry(degraded, "MNRO", capability(false, csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY)),
			storageEntry(degraded, "MNMW", capability(true, csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)),
			storageEntry(csipb.StorageHealthErrorType_UNKNOWN_STORAGE_HEALTH_ERROR_TYPE, "Unset", nil),
		}, want: []storagev1.StorageHealthCondition{
			{Status: storagev1.StorageUnreachable, Reason: "Down", Message: "m Down"},
			{Status: storagev1.StorageDegraded, Reason: "SNW", Message: "m SNW", AccessMode: &rwo, VolumeMode: &fs},
			{Status: storagev1.StorageDegraded, Reason: "SNSW", Message: "m SNSW", AccessMode: &rwop, VolumeMode: &block},
			{Status: storagev1.StorageDegraded, Reason: "MNRO", Message: "m MNRO", AccessMode: &rox, VolumeMode: &fs},
			{Status: storagev1.StorageDegraded, Reason: "MNMW", Message: "m MNMW", AccessMode: &rwx, VolumeMode: &block},
		}},
		{name: "no access type", entries: []*csipb.NodeGetStorageHealthResponse_StorageBackendHealth{
			storageEntry(degraded, "X", &csipb.VolumeCapability{AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}),
		}, wantErr: "no access type"},
		{name: "no access mode", entries: []*csipb.NodeGetStorageHealthResponse_StorageBackendHealth{
			storageEntry(degraded, "X", &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}}}),
		}, wantErr: "no access mode"},
		{name: "unknown access mode", entries: []*csipb.NodeGetStorageHealthResponse_StorageBackendHealth{
			storageEntry(degraded, "X", capability(false, csipb.VolumeCapability_AccessMode_UNKNOWN)),
		}, wantErr: "has no PV access mode"},
		{name: "17 conditions", entries: func() []*csipb.NodeGetStorageHealthResponse_StorageBackendHealth {
			out := make([]*csipb.NodeGetStorageHealthResponse_StorageBackendHealth, maxHealthConditions+1)
			for i := range out {
				out[i] = storageEntry(degraded, strings.Repeat("R", i+1), nil)
			}
			return out
		}(), wantErr: "17 conditions"},
	}
	srv, c := healthClient(t, csitest.Options{StorageHealth: true})
	if caps := c.Capabilities(); caps.VolumeHealth || !caps.StorageHealth {
		t.Fatalf("Capabilities = %+v", caps)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv.SetStorageHealth(tt.entries...)
			got, err := c.NodeGetStorageHealth(context.Background())
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("conditions (-want +got):\n%s", diff)
			}
		})
	}
}
