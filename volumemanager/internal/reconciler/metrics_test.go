package reconciler

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodevol/nodevol/podvol"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
)

// TestMigratedOperationMetric: operations on a migrated volume carry
// migrated="true" in storage_operation_duration_seconds, as in the kubelet.
func TestMigratedOperationMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	spec := podvol.VolumeSpec{Driver: "pd.csi.storage.gke.io", Mode: podvol.Filesystem}
	m.observe(oe.Outcome{Action: oe.Action{Kind: oe.OpPublish}, Spec: spec})
	spec.MigratedFrom = "kubernetes.io/gce-pd"
	m.observe(oe.Outcome{Action: oe.Action{Kind: oe.OpPublish}, Spec: spec})
	m.observe(oe.Outcome{Action: oe.Action{Kind: oe.OpPublish}, Spec: spec})
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, f := range fams {
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "migrated" {
					got[l.GetValue()] += s.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	if got["true"] != 2 || got["false"] != 1 {
		t.Errorf("samples by migrated label = %v, want true:2 false:1", got)
	}
}
