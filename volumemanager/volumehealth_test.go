package volumemanager

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr/funcr"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"
	fakeclock "k8s.io/utils/clock/testing"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/podvol"
)

// healthCall is one call of a recordingUpdater.
type healthCall struct {
	Pod, Volume string
	Conditions  []v1.VolumeHealthCondition
}

// recordingUpdater records what it is told; fail, while set, makes that
// many calls fail.
type recordingUpdater struct {
	mu    sync.Mutex
	calls []healthCall
	fail  int
}

func (u *recordingUpdater) SetPodVolumeHealth(_ context.Context, pod podvol.PodRef, volume string, conds []v1.VolumeHealthCondition) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.calls = append(u.calls, healthCall{Pod: pod.String(), Volume: volume, Conditions: conds})
	if u.fail > 0 {
		u.fail--
		return errors.New("status not synced yet")
	}
	return nil
}

// take returns the calls since the last take.
func (u *recordingUpdater) take() []healthCall {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := u.calls
	u.calls = nil
	return out
}

// healthEnv is a running manager with a fake clock, a csitest driver, a
// claim "a" (volume handle "handle-a") and the node's CSINode.
type healthEnv struct {
	t       *testing.T
	vm      *VolumeManager
	drv     *csitest.Server
	client  *fake.Clientset
	clk     *fakeclock.FakeClock
	reg     *prometheus.Registry
	updater *recordingUpdater
}

const healthInterval = time.Minute

// startHealthEnv starts a manager with Config.VolumeHealth hc (its
// Updater set to a recordingUpdater unless noUpdater; nil hc: off).
func startHealthEnv(t *testing.T, opts csitest.Options, hc *VolumeHealthConfig, noUpdater bool) *healthEnv {
	t.Helper()
	opts.CreateTargetDirs = true
	e := &healthEnv{t: t, drv: csitest.New(t, opts), clk: fakeclock.NewFakeClock(time.Now()), reg: prometheus.NewRegistry(), updater: &recordingUpdater{}}
	pvc, pv := csitest.BoundClaim("ns", "a", csitest.PVSpec{Driver: e.drv.DriverName(), Handle: "handle-a"})
	e.client = fake.NewClientset(csitest.CSIDriver(e.drv.DriverName(), csitest.CSIDriverSpec{}), pvc, pv, &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: node}})
	if hc != nil && !noUpdater {
		hc.Updater = e.updater
	}
	vm, stop := startVMWith(t, Config{NodeName: node, KubeClient: e.client, RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil),
		Clock: e.clk, Registerer: e.reg, VolumeHealth: hc}, e.drv)
	t.Cleanup(stop)
	e.vm = vm
	return e
}

// mount adds pod ns/p with the claim as volume "data" and waits for it.
func (e *healthEnv) mount() *v1.Pod {
	e.t.Helper()
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "a"}}})
	e.vm.AddPod(pod)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.vm.WaitForAttachAndMount(ctx, pod); err != nil {
		e.t.Fatal(err)
	}
	return pod
}

// round lets one more probe round run: the clock is stepped by the
// interval once the round before has set its timer.
func (e *healthEnv) round() {
	e.t.Helper()
	eventually(e.t, "a probe round done", func() bool { return e.vm.health.rounds.Load() > 0 })
	n := e.vm.health.rounds.Load()
	e.clk.Step(healthInterval)
	eventually(e.t, "the next probe round done", func() bool { return e.vm.health.rounds.Load() > n })
}

// statusUpdates counts the CSINode status updates made so far.
func (e *healthEnv) statusUpdates() int {
	n := 0
	for _, a := range e.client.Actions() {
		if a.GetVerb() == "update" && a.GetSubresource() == "status" && a.GetResource().Resource == "csinodes" {
			n++
		}
	}
	return n
}

// storageHealth is the driver's entry in the CSINode's status.
func (e *healthEnv) storageHealth() []storagev1.StorageHealthCondition {
	e.t.Helper()
	cn, err := e.client.StorageV1().CSINodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, h := range cn.Status.StorageHealth {
		if h.Name == e.drv.DriverName() {
			return h.HealthConditions
		}
	}
	return nil
}

// lastHealthRequest is the last NodeGetVolumeHealth request.
func (e *healthEnv) lastHealthRequest() *csipb.NodeGetVolumeHealthRequest {
	e.t.Helper()
	reqs := e.drv.Requests()
	for i := len(reqs) - 1; i >= 0; i-- {
		if r, ok := reqs[i].Req.(*csipb.NodeGetVolumeHealthRequest); ok {
			return r
		}
	}
	e.t.Fatal("no NodeGetVolumeHealth request")
	return nil
}

func volumeEntry(s csipb.VolumeHealthErrorType, reason, msg string) *csipb.VolumeHealth_VolumeHealthEntry {
	return &csipb.VolumeHealth_VolumeHealthEntry{Status: s, Reason: reason, Message: msg}
}

func backendEntry(reason, msg string) *csipb.NodeGetStorageHealthResponse_StorageBackendHealth {
	return &csipb.NodeGetStorageHealthResponse_StorageBackendHealth{Status: csipb.StorageHealthErrorType_STORAGE_UNREACHABLE, Reason: reason, Message: msg}
}

// TestVolumeHealthProbes drives the probes with the fake clock. The
// Updater hears of a mounted volume only when its (status, reason) set
// changes, with the paths the volume is staged and published at, and
// again at the next round when it failed; the CSINode's storage health is
// written once per change and never while it stays, and the gauge
// follows it.
func TestVolumeHealthProbes(t *testing.T) {
	e := startHealthEnv(t, csitest.Options{VolumeHealth: true, StorageHealth: true}, &VolumeHealthConfig{ProbeInterval: healthInterval}, false)
	e.drv.SetStorageHealth(backendEntry("Down", "no path"))
	e.mount()
	e.round() // no round runs from here on but those the steps make
	gauge := func() string { return samples(t, e.reg, "csi_node_storage_health_status") }
	down := `csi_node_storage_health_status{driver_name="` + e.drv.DriverName() + `",reason="Down",status="StorageUnreachable"} 1`
	degraded := []v1.VolumeHealthCondition{{Status: v1.VolumeHealthDegraded, Reason: "PathDown", Message: "one path down"}}
	steps := []struct {
		name    string
		volume  []*csipb.VolumeHealth_VolumeHealthEntry
		storage []*csipb.NodeGetStorageHealthResponse_StorageBackendHealth
		fail    int // Updater calls that fail
		calls   []healthCall
		updates int // CSINode status updates so far
		gauge   string
	}{
		{name: "healthy volume, storage down", storage: []*csipb.NodeGetStorageHealthResponse_StorageBackendHealth{backendEntry("Down", "no path")},
			updates: 1, gauge: down},
		{name: "degraded, the Updater fails", volume: []*csipb.VolumeHealth_VolumeHealthEntry{volumeEntry(csipb.VolumeHealthErrorType_DEGRADED, "PathDown", "one path down")},
			storage: []*csipb.NodeGetStorageHealthResponse_StorageBackendHealth{backendEntry("Down", "no path")}, fail: 1,
			calls: []healthCall{{"ns/p", "data", degraded}}, updates: 1, gauge: down},
		{name: "told again", volume: []*csipb.VolumeHealth_VolumeHealthEntry{volumeEntry(csipb.VolumeHealthErrorType_DEGRADED, "PathDown", "one path down")},
			storage: []*csipb.NodeGetStorageHealthResponse_StorageBackendHealth{backendEntry("Down", "no path")},
			calls:   []healthCall{{"ns/p", "data", degraded}}, updates: 1, gauge: down},
		{name: "new messages only", volume: []*csipb.VolumeHealth_VolumeHealthEntry{volumeEntry(csipb.VolumeHealthErrorType_DEGRADED, "PathDown", "still")},
			storage: []*csipb.NodeGetStorageHealthResponse_StorageBackendHealth{backendEntry("Down", "still no path")}, updates: 1, gauge: down},
		{name: "all healthy", calls: []healthCall{{"ns/p", "data", nil}}, updates: 2},
		{name: "still healthy", updates: 2},
	}
	for _, s := range steps {
		e.drv.SetVolumeHealth("handle-a", s.volume...)
		e.drv.SetStorageHealth(s.storage...)
		e.updater.mu.Lock()
		e.updater.fail = s.fail
		e.updater.mu.Unlock()
		asked := e.drv.Calls("NodeGetVolumeHealth")
		e.round()
		if e.drv.Calls("NodeGetVolumeHealth") != asked+1 {
			t.Errorf("%s: NodeGetVolumeHealth called %d times in the round, want once", s.name, e.drv.Calls("NodeGetVolumeHealth")-asked)
		}
		if diff := cmp.Diff(s.calls, e.updater.take()); diff != "" {
			t.Errorf("%s: Updater calls (-want +got):\n%s", s.name, diff)
		}
		if got := e.statusUpdates(); got != s.updates {
			t.Errorf("%s: %d CSINode status updates, want %d", s.name, got, s.updates)
		}
		if got := gauge(); got != s.gauge {
			t.Errorf("%s: gauge %q, want %q", s.name, got, s.gauge)
		}
		if got, want := len(e.storageHealth()), len(s.storage); got != want {
			t.Errorf("%s: %d storage health conditions in the CSINode, want %d", s.name, got, want)
		}
	}
	req := e.lastHealthRequest()
	staged := e.drv.StagedVolumes()["handle-a"]
	if req.GetVolumeId() != "handle-a" || req.GetStagingTargetPath() != staged || staged == "" ||
		!cmp.Equal([]string{req.GetVolumePublishPath()}, e.drv.PublishedVolumes()["handle-a"]) {
		t.Errorf("request %v; staged at %q, published at %q", req, staged, e.drv.PublishedVolumes()["handle-a"])
	}
}

// TestVolumeHealthAttempted: a volume whose stage fails is probed all
// the same (the driver may say why), with no paths, as the kubelet; once
// its pod is gone it is not probed any more.
func TestVolumeHealthAttempted(t *testing.T) {
	e := startHealthEnv(t, csitest.Options{VolumeHealth: true}, &VolumeHealthConfig{ProbeInterval: healthInterval, NoStorageHealth: true}, false)
	e.drv.Inject(csitest.Fault{Method: "NodeStageVolume", Err: status.Error(codes.Internal, "no path to the array")})
	e.drv.SetVolumeHealth("handle-a", volumeEntry(csipb.VolumeHealthErrorType_INACCESSIBLE, "NoPath", "array unreachable"))
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "a"}}})
	e.vm.AddPod(pod)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.drv.WaitForCalls(ctx, "NodeStageVolume", 1); err != nil {
		t.Fatal(err)
	}
	e.round()
	want := []healthCall{{"ns/p", "data", []v1.VolumeHealthCondition{{Status: v1.VolumeHealthInaccessible, Reason: "NoPath", Message: "array unreachable"}}}}
	if diff := cmp.Diff(want, e.updater.take()); diff != "" {
		t.Errorf("Updater calls (-want +got):\n%s", diff)
	}
	if r := e.lastHealthRequest(); r.GetStagingTargetPath() != "" || r.GetVolumePublishPath() != "" {
		t.Errorf("paths of a volume never staged: %v", r)
	}
	e.vm.DeletePod(pod)
	waitIdle(t, e.vm)
	e.round()
	asked := e.drv.Calls("NodeGetVolumeHealth")
	e.round()
	if got := e.drv.Calls("NodeGetVolumeHealth"); got != asked {
		t.Errorf("NodeGetVolumeHealth called %d times after the pod went", got-asked)
	}
	if calls := e.updater.take(); len(calls) != 0 {
		t.Errorf("Updater told of a pod that went: %v", calls)
	}
}

// TestVolumeHealthNotAsked: nothing is asked when the option is off, the
// driver lacks the capability, or the part is turned off; the CSINode is
// not touched and the Updater not called.
func TestVolumeHealthNotAsked(t *testing.T) {
	both := csitest.Options{VolumeHealth: true, StorageHealth: true}
	tests := []struct {
		name               string
		driver             csitest.Options
		hc                 *VolumeHealthConfig
		noUpdater          bool
		wantVolume, wantSt bool
	}{
		{name: "option off", driver: both},
		{name: "no capabilities", hc: &VolumeHealthConfig{ProbeInterval: healthInterval}},
		{name: "no storage health", driver: both, hc: &VolumeHealthConfig{ProbeInterval: healthInterval, NoStorageHealth: true}, wantVolume: true},
		{name: "no Updater", driver: both, hc: &VolumeHealthConfig{ProbeInterval: healthInterval}, noUpdater: true, wantSt: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := startHealthEnv(t, tt.driver, tt.hc, tt.noUpdater)
			e.drv.SetStorageHealth(backendEntry("Down", ""))
			e.drv.SetVolumeHealth("handle-a", volumeEntry(csipb.VolumeHealthErrorType_DEGRADED, "Slow", ""))
			e.mount()
			if tt.hc == nil {
				if e.vm.health != nil {
					t.Fatal("health probes set up with the option off")
				}
			} else {
				e.round()
				e.round()
			}
			if got := e.drv.Calls("NodeGetVolumeHealth") > 0; got != tt.wantVolume {
				t.Errorf("NodeGetVolumeHealth called: %v, want %v", got, tt.wantVolume)
			}
			if got := e.drv.Calls("NodeGetStorageHealth") > 0; got != tt.wantSt {
				t.Errorf("NodeGetStorageHealth called: %v, want %v", got, tt.wantSt)
			}
			if got := len(e.updater.take()) > 0; got != tt.wantVolume {
				t.Errorf("Updater called: %v, want %v", got, tt.wantVolume)
			}
			if got := e.statusUpdates() > 0; got != tt.wantSt {
				t.Errorf("CSINode status updated: %v, want %v", got, tt.wantSt)
			}
		})
	}
	if _, err := New(Config{NodeName: node, KubeClient: fake.NewClientset(), VolumeHealth: &VolumeHealthConfig{NoStorageHealth: true}}); err == nil {
		t.Error("New took a VolumeHealth that probes nothing")
	}
}

// TestVolumeHealthLogChange: a probe error is logged once per change of
// its text, not at every round, and its end once.
func TestVolumeHealthLogChange(t *testing.T) {
	var lines []string
	logger := funcr.New(func(prefix, args string) { lines = append(lines, args) }, funcr.Options{})
	last := map[string]string{}
	kv := []any{"driver", "d"}
	for _, err := range []error{nil, errors.New("a"), errors.New("a"), errors.New("b"), nil, nil, errors.New("b")} {
		logChange(logger, last, "d", err, "failed", "recovered", kv)
	}
	want := []string{
		`"msg"="failed" "error"="a" "driver"="d"`,
		`"msg"="failed" "error"="b" "driver"="d"`,
		`"level"=0 "msg"="recovered" "driver"="d"`,
		`"msg"="failed" "error"="b" "driver"="d"`,
	}
	if diff := cmp.Diff(want, lines); diff != "" {
		t.Errorf("log lines (-want +got):\n%s", diff)
	}
	if fmt.Sprint(last) != "map[d:b]" {
		t.Errorf("last = %v", last)
	}
}
