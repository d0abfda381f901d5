package kubeletbench

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/component-base/metrics/legacyregistry"
	volumeutil "k8s.io/kubernetes/pkg/volume/util"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/volumemanager"
)

var sharedRuns atomic.Int32

// TestSharesKubeletMetrics: in a kubelet fork, whose registerer holds the
// kubelet v1.37.2's own volume metrics (registered by the kubelet's
// functions into component-base's legacy registry), New works, and the
// manager counts its mount into the kubelet's collectors: operation
// durations, the end to end mount time, CSI calls and the volume counts,
// gathered once each, with the kubelet's help.
func TestSharesKubeletMetrics(t *testing.T) {
	// The kubelet's volume manager metrics are registered by TestMain
	// (vmmetrics.Register), its operation metrics here.
	volumeutil.RegisterMetrics()

	// The kubelet's registry lives as long as the process: a driver of
	// its own names each run's series (go test -count).
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true, DriverName: fmt.Sprintf("run%d.shared.csitest.nodevol.io", sharedRuns.Add(1))})
	pvc, pv := csitest.BoundClaim("ns", "a", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-a"})
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{}), pvc, pv)
	reconstructedBefore := gatherSeries(t)[`reconstruct_volume_operations_total{}`]
	vm, err := volumemanager.New(volumemanager.Config{NodeName: "node-1", KubeClient: client, RootDir: t.TempDir(),
		Mounter: mount.NewFakeMounter(nil), Registerer: legacyregistry.Registerer()})
	if err != nil {
		t.Fatalf("New on the kubelet's registerer: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- vm.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	if err := vm.Drivers().Register(ctx, drv.DriverName(), drv.Endpoint()); err != nil {
		t.Fatal(err)
	}
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "a"}}})
	vm.AddPod(pod)
	if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}

	plugin := "kubernetes.io/csi:" + drv.DriverName()
	// The kubelet's own collector holds the manager's samples.
	if n := samplesOf(t, volumeutil.StorageOperationMetric, plugin); n != 2 {
		t.Errorf("the kubelet's storage_operation_duration_seconds holds %d samples of the manager's verify_controller_attached_volume and volume_mount, want 2", n)
	}

	got := gatherSeries(t)
	for series, want := range map[string]string{
		fmt.Sprintf(`storage_operation_duration_seconds{migrated="false",operation_name="volume_mount",status="success",volume_plugin=%q}`, plugin):                 "[BETA] Storage operation duration 1",
		fmt.Sprintf(`volume_operation_total_seconds{operation_name="overall_volume_mount",plugin_name=%q}`, plugin):                                                 "[BETA] Storage operation end to end duration in seconds 1",
		fmt.Sprintf(`csi_operations_seconds{driver_name=%q,grpc_status_code="OK",method_name="/csi.v1.Node/NodePublishVolume",migrated="false"}`, drv.DriverName()): "[ALPHA] Container Storage Interface operation duration with gRPC error code status total 1",
		fmt.Sprintf(`volume_manager_total_volumes{plugin_name=%q,state="actual_state_of_world"}`, plugin):                                                           "[ALPHA] Number of volumes in Volume Manager 1",
		fmt.Sprintf(`volume_manager_total_volumes{plugin_name=%q,state="desired_state_of_world"}`, plugin):                                                          "[ALPHA] Number of volumes in Volume Manager 1",
		// Nothing to reconstruct in an empty root: the kubelet's count as
		// it was (the hand-over tests of this process add theirs).
		`reconstruct_volume_operations_total{}`: reconstructedBefore,
	} {
		if got[series] != want {
			t.Errorf("%s: %q, want %q", series, got[series], want)
		}
	}
}

// samplesOf returns the histogram samples c holds in its series that have
// a label of value label.
func samplesOf(t *testing.T, c prometheus.Collector, label string) uint64 {
	t.Helper()
	ch := make(chan prometheus.Metric)
	go func() {
		defer close(ch)
		c.Collect(ch)
	}()
	var n uint64
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		for _, l := range d.GetLabel() {
			if l.GetValue() == label {
				n += d.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}

// gatherSeries gathers the kubelet's registry: each series (name and labels)
// with its help and value (a histogram's sample count).
func gatherSeries(t *testing.T) map[string]string {
	t.Helper()
	fams, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatalf("gathering the kubelet's registry: %v", err)
	}
	got := map[string]string{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			if h := m.GetHistogram(); h != nil {
				v = float64(h.GetSampleCount())
			}
			got[f.GetName()+"{"+strings.Join(labels, ",")+"}"] = fmt.Sprintf("%s %g", f.GetHelp(), v)
		}
	}
	return got
}
