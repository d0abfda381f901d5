package csi

import (
	"context"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// histogramCounts returns the sample counts of a histogram family by its
// labels, rendered "k=v,k=v" in the order given.
func histogramCounts(t *testing.T, reg prometheus.Gatherer, name string, labels ...string) map[string]uint64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			out[labelString(m, labels)] += m.GetHistogram().GetSampleCount()
		}
	}
	return out
}

func labelString(m *dto.Metric, names []string) string {
	var s string
	for _, n := range names {
		for _, l := range m.GetLabel() {
			if l.GetName() == n {
				if s != "" {
					s += ","
				}
				s += n + "=" + l.GetValue()
			}
		}
	}
	return s
}

// TestCallMetrics: every CSI call is measured by driver, method and gRPC
// code; two registries may share one Prometheus registerer.
func TestCallMetrics(t *testing.T) {
	ctx := context.Background()
	srv := csitest.New(t, csitest.Options{})
	prom := prometheus.NewRegistry()
	regs := []*Registry{NewRegistry(RegistryOptions{Registerer: prom}), NewRegistry(RegistryOptions{Registerer: prom})}
	for _, r := range regs {
		t.Cleanup(func() { _ = r.Close() })
		if err := r.Register(ctx, srv.DriverName(), srv.Endpoint()); err != nil {
			t.Fatal(err)
		}
	}
	srv.Inject(csitest.Fault{Method: "NodeStageVolume", Err: status.Error(codes.Internal, "boom")})
	c, err := regs[0].Client(srv.DriverName())
	if err != nil {
		t.Fatal(err)
	}
	_ = c.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: "v", StagingTargetPath: t.TempDir(),
		VolumeCapability: &csipb.VolumeCapability{
			AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}},
			AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}})
	got := histogramCounts(t, prom, "csi_operations_seconds", "driver_name", "method_name", "grpc_status_code")
	d := "driver_name=" + srv.DriverName()
	want := map[string]uint64{
		d + ",method_name=/csi.v1.Node/NodeGetCapabilities,grpc_status_code=OK":   2,
		d + ",method_name=/csi.v1.Node/NodeStageVolume,grpc_status_code=Internal": 1,
	}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("csi_operations_seconds{%s}: %d samples, want %d (all: %v)", k, got[k], n, got)
		}
	}
}
