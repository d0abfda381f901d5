package volumemanager

import (
	"context"
	"maps"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/volumemanager/internal/planner"
)

// rwxEnv is a manager with pod ns/p running on claim ns/shared (handle
// handle-shared, 1Gi) before another node grows it.
type rwxEnv struct {
	*expandEnv
	pvc *v1.PersistentVolumeClaim
	log *podEventLog
}

// podEventLog is a FakeRecorder that also keeps how many events of each
// reason each pod got (the FakeRecorder's strings do not name the pod).
type podEventLog struct {
	*record.FakeRecorder
	mu    sync.Mutex
	byPod map[string]map[string]int
}

func (l *podEventLog) Event(obj runtime.Object, kind, reason, msg string) {
	if ref, ok := obj.(*v1.ObjectReference); ok && ref.Kind == "Pod" {
		l.mu.Lock()
		if l.byPod[reason] == nil {
			l.byPod[reason] = map[string]int{}
		}
		l.byPod[reason][ref.Name]++
		l.mu.Unlock()
	}
	l.FakeRecorder.Event(obj, kind, reason, msg)
}

// pods returns how many events of reason each pod got.
func (l *podEventLog) pods(reason string) map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.byPod[reason])
}

func newRWXEnv(t *testing.T, access v1.PersistentVolumeAccessMode, annotated, driverExpands bool) *rwxEnv {
	t.Helper()
	drv := csitest.New(t, csitest.Options{Expand: driverExpands, CreateTargetDirs: true})
	pvc, pv := csitest.BoundClaim("ns", "shared", csitest.PVSpec{
		Driver:      drv.DriverName(),
		Handle:      "handle-shared",
		Capacity:    "1Gi",
		AccessModes: []v1.PersistentVolumeAccessMode{access},
	})
	if annotated {
		pvc.Annotations = map[string]string{planner.NodeExpansionNotRequired: "true"}
	}
	e := &expandEnv{t: t, drv: drv, pv: pv.Name, client: fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{}), pvc, pv), events: record.NewFakeRecorder(100)}
	log := &podEventLog{FakeRecorder: e.events, byPod: map[string]map[string]int{}}
	vm, err := New(Config{NodeName: node, KubeClient: e.client, RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil), EventRecorder: log,
		ClusterInformers: true}) // the claims' changes at once
	if err != nil {
		t.Fatal(err)
	}
	e.vm = vm
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- vm.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	if err := vm.Drivers().Register(ctx, drv.DriverName(), drv.Endpoint()); err != nil {
		t.Fatal(err)
	}
	if err := e.mount(csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "shared"}}})); err != nil {
		t.Fatal(err)
	}
	return &rwxEnv{expandEnv: e, pvc: pvc, log: log}
}

// grownElsewhere is another node's expansion (or the controller's alone):
// the PV is 2Gi and the claim's status reports 2Gi with no resize status.
// It returns once the manager's listers have both.
func (e *rwxEnv) grownElsewhere() {
	e.t.Helper()
	ctx := context.Background()
	pv, err := e.client.CoreV1().PersistentVolumes().Get(ctx, e.pv, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	pv.Spec.Capacity[v1.ResourceStorage] = resource.MustParse("2Gi")
	if _, err := e.client.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	pvc := e.pvc.DeepCopy()
	pvc.Status.Capacity[v1.ResourceStorage] = resource.MustParse("2Gi")
	if _, err := e.client.CoreV1().PersistentVolumeClaims("ns").UpdateStatus(ctx, pvc, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	eventually(e.t, "the listers have the grown PV and claim", func() bool {
		pv, err := e.vm.resolver.PVs.Get(e.pv)
		if err != nil {
			return false
		}
		c, err := e.vm.resolver.PVCs.PersistentVolumeClaims("ns").Get("shared")
		if err != nil {
			return false
		}
		size, have := pv.Spec.Capacity[v1.ResourceStorage], c.Status.Capacity[v1.ResourceStorage]
		return size.Value() == 2<<30 && have.Value() == 2<<30
	})
}

// nodeSize is the size the manager has the volume at on this node.
func (e *rwxEnv) nodeSize() int64 {
	for _, n := range e.vm.asw.VolumeNames() {
		if v, _ := e.vm.asw.Volume(n); v.Spec.PVName == e.pv {
			return v.Size
		}
	}
	return 0
}

// TestExpandGrownElsewhere: a claim's status reports its volume grown
// (another node expanded it, or the controller alone) while this node has
// it mounted at the old size. A ReadWriteMany volume is grown here too
// (kubernetes#131907), once, and the claim is not written; with
// volume.kubernetes.io/node-expansion-not-required, or ReadWriteOnce, the
// claim's word is enough. A pod added later waits for the expansion
// (expansions go first), so its mount says the decision was taken.
func TestExpandGrownElsewhere(t *testing.T) {
	tests := []struct {
		name      string
		access    v1.PersistentVolumeAccessMode
		annotated bool
		calls     int
	}{
		{"ReadWriteMany", v1.ReadWriteMany, false, 1},
		{"ReadWriteMany annotated node-expansion-not-required", v1.ReadWriteMany, true, 0},
		{"ReadWriteOnce", v1.ReadWriteOnce, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newRWXEnv(t, tt.access, tt.annotated, true)
			e.grownElsewhere()
			if err := e.mount(csitest.Pod("ns", "q", csitest.PodSpec{Volumes: []csitest.PodVolume{
				{Name: "data", Claim: "shared"},
			}})); err != nil {
				t.Fatal(err)
			}
			if err := e.mount(csitest.Pod("ns", "r", csitest.PodSpec{Volumes: []csitest.PodVolume{
				{Name: "data", Claim: "shared"},
			}})); err != nil {
				t.Fatal(err)
			}
			reqs := requests[*csi.NodeExpandVolumeRequest](e.drv, "NodeExpandVolume")
			if len(reqs) != tt.calls {
				t.Fatalf("NodeExpandVolume called %d times, want %d", len(reqs), tt.calls)
			}
			if tt.calls > 0 {
				if got := reqs[0].GetCapacityRange().GetRequiredBytes(); reqs[0].GetVolumeId() != "handle-shared" || got != 2<<30 {
					t.Errorf("NodeExpandVolume of %s to %d bytes, want handle-shared to 2Gi", reqs[0].GetVolumeId(), got)
				}
				// The pods that use the volume when it is grown get the
				// event, once each: p, and q or r if added by then.
				if got := e.log.pods("FileSystemResizeSuccessful"); got["p"] != 1 || got["q"] > 1 || got["r"] > 1 || len(got) > 3 {
					t.Errorf("FileSystemResizeSuccessful events by pod %v, want p's one (and one for q or r at most)", got)
				}
				if got := e.nodeSize(); got != 2<<30 {
					t.Errorf("node has the volume at %d bytes, want 2Gi", got)
				}
			}
			if p := e.statusPatches(); len(p) != 0 {
				t.Errorf("claim status patches %v, want none: the claim already reports the size", p)
			}
		})
	}
}

// TestExpandGrownElsewhereDriverCannot: a ReadWriteMany volume grown
// elsewhere whose driver has no node expansion (no EXPAND_VOLUME) is done
// on this node without an error, and the claim gets no NodeResizeError
// (kubernetes#131381, #131495).
func TestExpandGrownElsewhereDriverCannot(t *testing.T) {
	e := newRWXEnv(t, v1.ReadWriteMany, false, false)
	e.grownElsewhere()
	if err := e.mount(csitest.Pod("ns", "q", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "shared"}}})); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the node takes the volume at 2Gi", func() bool { return e.nodeSize() == 2<<30 })
	if p := e.statusPatches(); len(p) != 0 {
		t.Errorf("claim status patches %v, want none", p)
	}
	c, err := e.client.CoreV1().PersistentVolumeClaims("ns").Get(context.Background(), "shared", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st := c.Status; len(st.Conditions) != 0 || len(st.AllocatedResourceStatuses) != 0 {
		t.Errorf("claim conditions %v, resize statuses %v: want none", st.Conditions, st.AllocatedResourceStatuses)
	}
	if evs := e.eventsWith("Warning"); len(evs) != 0 {
		t.Errorf("warning events %v, want none (no FileSystemResizeFailed, no VolumeResizeFailed)", evs)
	}
	if n := e.drv.Calls("NodeExpandVolume"); n != 0 {
		t.Errorf("NodeExpandVolume called %d times on a driver without EXPAND_VOLUME", n)
	}
}
