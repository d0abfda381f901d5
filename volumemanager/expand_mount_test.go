package volumemanager

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// expandEnv is a manager whose claim ns/grow (handle
// handle-grow, PV name in pv) the controller has grown from 1Gi to 2Gi before any pod
// uses it: the claim's status capacity is 1Gi and its storage resize status
// NodeResizePending, as the external-resizer leaves it.
type expandEnv struct {
	t      *testing.T
	drv    *csitest.Server
	client *fake.Clientset
	pv     string
	vm     *VolumeManager
	events *record.FakeRecorder
}

func newExpandEnv(t *testing.T, block bool, faults ...csitest.Fault) *expandEnv {
	t.Helper()
	drv := csitest.New(t, csitest.Options{Expand: true, CreateTargetDirs: true})
	for _, f := range faults {
		drv.Inject(f)
	}
	pvc, pv := csitest.BoundClaim("ns", "grow", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-grow", Capacity: "2Gi", Block: block})
	pvc.ResourceVersion = "7"
	pvc.Status.Capacity = v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")}
	pvc.Status.AllocatedResourceStatuses = map[v1.ResourceName]v1.ClaimResourceStatus{v1.ResourceStorage: v1.PersistentVolumeClaimNodeResizePending}
	e := &expandEnv{t: t, drv: drv, pv: pv.Name, client: fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{}), pvc, pv), events: newObjectRecorder(100)}
	vm, err := New(Config{NodeName: node, KubeClient: e.client, RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil),
		BlockMapper: &recordingBlockMapper{}, EventRecorder: e.events, ClusterInformers: true}) // the claims' changes at once
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
	return e
}

func (e *expandEnv) mount(pod *v1.Pod) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	e.vm.AddPod(pod)
	return e.vm.WaitForAttachAndMount(ctx, pod)
}

func (e *expandEnv) claimStatus() v1.PersistentVolumeClaimStatus {
	e.t.Helper()
	c, err := e.client.CoreV1().PersistentVolumeClaims("ns").Get(context.Background(), "grow", metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return c.Status
}

// statusPatches returns the claim status patches written, decoded.
func (e *expandEnv) statusPatches() []map[string]any {
	var out []map[string]any
	for _, a := range e.client.Actions() {
		p, ok := a.(k8stesting.PatchAction)
		if !ok || a.GetResource().Resource != "persistentvolumeclaims" {
			continue
		}
		if a.GetSubresource() != "status" || p.GetPatchType() != types.StrategicMergePatchType {
			e.t.Errorf("claim patch %s/%s of type %s: want a strategic merge patch of the status", a.GetSubresource(), p.GetName(), p.GetPatchType())
		}
		var m map[string]any
		if err := json.Unmarshal(p.GetPatch(), &m); err != nil {
			e.t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

// requests returns the driver's requests of method, in order.
func requests[T any](drv *csitest.Server, method string) []T {
	var out []T
	for _, r := range drv.Requests() {
		if r.Method == method {
			out = append(out, r.Req.(T))
		}
	}
	return out
}

func methods(drv *csitest.Server) []string {
	var out []string
	for _, r := range drv.Requests() {
		if strings.HasPrefix(r.Method, "Node") && r.Method != "NodeGetCapabilities" && r.Method != "NodeGetInfo" {
			out = append(out, r.Method)
		}
	}
	return out
}

func (e *expandEnv) eventsWith(reason string) []string {
	var out []string
	for {
		select {
		case ev := <-e.events.Events:
			if strings.HasPrefix(ev, reason+" ") || strings.Contains(ev, " "+reason+" ") { // a type or a reason
				out = append(out, ev)
			}
		default:
			return out
		}
	}
}

// TestExpandWhileMounting: a pod started after the controller grew its
// volume gets it at the new size: NodeExpandVolume runs after
// NodePublishVolume and before WaitForAttachAndMount returns, with the
// pod's volume path, the staging path, the PV's size and the volume's
// capability; the claim goes NodeResizeInProgress, then reports the new
// capacity with its resize status cleared, through strategic merge patches
// of the status; the pod gets FileSystemResizeSuccessful.
func TestExpandWhileMounting(t *testing.T) {
	e := newExpandEnv(t, false)
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "grow"}}})
	if err := e.mount(pod); err != nil {
		t.Fatal(err)
	}
	if got, want := methods(e.drv), []string{"NodeStageVolume", "NodePublishVolume", "NodeExpandVolume"}; !slices.Equal(got, want) {
		t.Fatalf("calls %v, want %v", got, want)
	}
	stage := requests[*csi.NodeStageVolumeRequest](e.drv, "NodeStageVolume")[0]
	publish := requests[*csi.NodePublishVolumeRequest](e.drv, "NodePublishVolume")[0]
	exp := requests[*csi.NodeExpandVolumeRequest](e.drv, "NodeExpandVolume")[0]
	want := &csi.NodeExpandVolumeRequest{
		VolumeId:          "handle-grow",
		VolumePath:        publish.GetTargetPath(),
		StagingTargetPath: stage.GetStagingTargetPath(),
		CapacityRange:     &csi.CapacityRange{RequiredBytes: 2 << 30},
		VolumeCapability: &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: stage.GetVolumeCapability().GetMount().GetFsType()}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		},
	}
	if diff := cmp.Diff(want, exp, protocmp.Transform()); diff != "" {
		t.Errorf("NodeExpandVolume request (-want +got):\n%s", diff)
	}
	if vols := e.vm.GetMountedVolumesForPod(pod.UID); len(vols) != 1 || vols[0].Path != publish.GetTargetPath() {
		t.Errorf("mounted volumes %v, want the volume at %s", vols, publish.GetTargetPath())
	}
	wantStatus := v1.PersistentVolumeClaimStatus{Phase: v1.ClaimBound, AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}, Capacity: v1.ResourceList{v1.ResourceStorage: resource.MustParse("2Gi")}}
	if diff := cmp.Diff(wantStatus, e.claimStatus()); diff != "" {
		t.Errorf("claim status (-want +got):\n%s", diff)
	}
	patches := e.statusPatches()
	wantFirst := map[string]any{
		"metadata": map[string]any{"resourceVersion": "7"},
		"status":   map[string]any{"allocatedResourceStatuses": map[string]any{"storage": "NodeResizeInProgress"}},
	}
	if len(patches) != 2 || !cmp.Equal(patches[0], wantFirst) {
		t.Fatalf("claim status patches %v: want 2, the first %v", patches, wantFirst)
	}
	if st, _ := patches[1]["status"].(map[string]any); st == nil || st["allocatedResourceStatuses"] != nil || st["capacity"] == nil {
		t.Errorf("second patch %v: want the capacity set and allocatedResourceStatuses removed", patches[1])
	}
	// The kubelet's: on the pod and on the claim, the node's name after
	// the volume.
	msg := fmt.Sprintf(`Normal FileSystemResizeSuccessful MountVolume.NodeExpandVolume succeeded for volume %q node-1`, e.pv)
	wantEvents := []string{msg + " involvedObject{kind=Pod,apiVersion=v1}", msg + " involvedObject{kind=PersistentVolumeClaim,apiVersion=v1}"}
	if evs := e.eventsWith("FileSystemResizeSuccessful"); !slices.Equal(evs, wantEvents) {
		t.Errorf("FileSystemResizeSuccessful events\n%q\nwant\n%q", evs, wantEvents)
	}

	// A second pod: nothing left to expand.
	if err := e.mount(csitest.Pod("ns", "q", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "grow"}}})); err != nil {
		t.Fatal(err)
	}
	if n := e.drv.Calls("NodeExpandVolume"); n != 1 {
		t.Errorf("NodeExpandVolume called %d times, want 1", n)
	}
}

// TestExpandWhileMappingBlock: a block volume grown by the controller is
// grown on the node when mapped, as the kubelet's MapVolume does: volume
// path the pod's publish path (the device file the driver published),
// staging path the block staging path, a block capability.
func TestExpandWhileMappingBlock(t *testing.T) {
	e := newExpandEnv(t, true)
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "raw", Claim: "grow", Block: true}}})
	if err := e.mount(pod); err != nil {
		t.Fatal(err)
	}
	if got, want := methods(e.drv), []string{"NodeStageVolume", "NodePublishVolume", "NodeExpandVolume"}; !slices.Equal(got, want) {
		t.Fatalf("calls %v, want %v", got, want)
	}
	stage := requests[*csi.NodeStageVolumeRequest](e.drv, "NodeStageVolume")[0]
	publish := requests[*csi.NodePublishVolumeRequest](e.drv, "NodePublishVolume")[0]
	exp := requests[*csi.NodeExpandVolumeRequest](e.drv, "NodeExpandVolume")[0]
	if !strings.HasSuffix(publish.GetTargetPath(), "/volumeDevices/publish/"+e.pv+"/"+string(pod.UID)) || !strings.HasSuffix(stage.GetStagingTargetPath(), "/volumeDevices/staging/"+e.pv) {
		t.Fatalf("publish path %s, staging path %s: not the kubelet's block layout", publish.GetTargetPath(), stage.GetStagingTargetPath())
	}
	want := &csi.NodeExpandVolumeRequest{
		VolumeId:          "handle-grow",
		VolumePath:        publish.GetTargetPath(),
		StagingTargetPath: stage.GetStagingTargetPath(),
		CapacityRange:     &csi.CapacityRange{RequiredBytes: 2 << 30},
		VolumeCapability: &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		},
	}
	if diff := cmp.Diff(want, exp, protocmp.Transform()); diff != "" {
		t.Errorf("NodeExpandVolume request (-want +got):\n%s", diff)
	}
	wantStatus := v1.PersistentVolumeClaimStatus{Phase: v1.ClaimBound, AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}, Capacity: v1.ResourceList{v1.ResourceStorage: resource.MustParse("2Gi")}}
	if diff := cmp.Diff(wantStatus, e.claimStatus()); diff != "" {
		t.Errorf("claim status (-want +got):\n%s", diff)
	}
}

// TestExpandRefused: the driver refuses the expansion (OutOfRange, which
// the kubelet treats as infeasible): the pod's volume is mounted and usable
// at its old size; the claim says NodeResizeInfeasible with a
// NodeResizeError condition giving the cause; the pod gets the kubelet's
// event of an expansion while mounting that failed, with the cause in its
// words; nothing retries, not even for a new pod, until the claim changes.
func TestExpandRefused(t *testing.T) {
	e := newExpandEnv(t, false, csitest.Fault{Method: "NodeExpandVolume", Err: status.Error(codes.OutOfRange, "volume handle-grow has only 1073741824 bytes")})
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "grow"}}})
	if err := e.mount(pod); err != nil {
		t.Fatalf("mount with a refused expansion: %v", err)
	}
	if vols := e.vm.GetMountedVolumesForPod(pod.UID); len(vols) != 1 {
		t.Fatalf("mounted volumes %v, want 1", vols)
	}
	st := e.claimStatus()
	if got := st.AllocatedResourceStatuses[v1.ResourceStorage]; got != v1.PersistentVolumeClaimNodeResizeInfeasible {
		t.Errorf("claim resize status %q, want NodeResizeInfeasible", got)
	}
	if got := st.Capacity[v1.ResourceStorage]; got.Cmp(resource.MustParse("1Gi")) != 0 {
		t.Errorf("claim capacity %s, want 1Gi", got.String())
	}
	if len(st.Conditions) != 1 || st.Conditions[0].Type != v1.PersistentVolumeClaimNodeResizeError || st.Conditions[0].Status != v1.ConditionTrue ||
		!strings.HasPrefix(st.Conditions[0].Message, "failed to expand pvc with ") || !strings.Contains(st.Conditions[0].Message, "OutOfRange") {
		t.Errorf("claim conditions %+v, want NodeResizeError with the cause", st.Conditions)
	}
	want := []string{fmt.Sprintf("Warning FailedMount MountVolume.Setup failed while expanding volume for volume %q : "+
		"Expander.NodeExpand failed to expand the volume rpc error: code = OutOfRange desc = volume handle-grow has only 1073741824 bytes involvedObject{kind=Pod,apiVersion=v1}", e.pv)}
	if evs := e.eventsWith("FailedMount"); !slices.Equal(evs, want) {
		t.Fatalf("FailedMount events\n%q\nwant\n%q", evs, want)
	}
	// A new pod mounts at once, without another try.
	if err := e.mount(csitest.Pod("ns", "q", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "grow"}}})); err != nil {
		t.Fatal(err)
	}
	if n := e.drv.Calls("NodeExpandVolume"); n != 1 {
		t.Errorf("NodeExpandVolume called %d times, want 1", n)
	}
}

// TestExpandFailureRetried: a final error that is not a refusal (Internal)
// gives the claim the NodeResizeError condition (its resize status stays
// NodeResizeInProgress), keeps the pod from starting on the old size (its
// mount is uncertain; the kubelet's FailedMount of an expansion while
// mounting), and the expansion is retried with backoff: the second try
// succeeds and clears the claim.
func TestExpandFailureRetried(t *testing.T) {
	e := newExpandEnv(t, false, csitest.Fault{Method: "NodeExpandVolume", Times: 1, Err: status.Error(codes.Internal, "resize2fs crashed")})
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "grow"}}})
	if err := e.mount(pod); err != nil {
		t.Fatal(err)
	}
	if n := e.drv.Calls("NodeExpandVolume"); n != 2 {
		t.Errorf("NodeExpandVolume called %d times, want 2", n)
	}
	patches := e.statusPatches()
	if len(patches) != 3 {
		t.Fatalf("claim status patches %v, want 3 (in progress, error, done)", patches)
	}
	st, _ := patches[1]["status"].(map[string]any)
	conds, _ := st["conditions"].([]any)
	cond, _ := func() (map[string]any, bool) {
		if len(conds) != 1 {
			return nil, false
		}
		c, ok := conds[0].(map[string]any)
		return c, ok
	}()
	if _, rv := patches[1]["metadata"]; rv || cond["type"] != "NodeResizeError" || cond["status"] != "True" ||
		!strings.Contains(cond["message"].(string), "resize2fs crashed") || st["allocatedResourceStatuses"] != nil {
		t.Errorf("failure patch %v: want only the NodeResizeError condition with the cause, without resourceVersion", patches[1])
	}
	wantStatus := v1.PersistentVolumeClaimStatus{Phase: v1.ClaimBound, AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}, Capacity: v1.ResourceList{v1.ResourceStorage: resource.MustParse("2Gi")}}
	if diff := cmp.Diff(wantStatus, e.claimStatus()); diff != "" {
		t.Errorf("claim status (-want +got):\n%s", diff)
	}
	want := []string{fmt.Sprintf("Warning FailedMount MountVolume.Setup failed while expanding volume for volume %q : "+
		"Expander.NodeExpand failed to expand the volume : rpc error: code = Internal desc = resize2fs crashed involvedObject{kind=Pod,apiVersion=v1}", e.pv)}
	if evs := e.eventsWith("FailedMount"); !slices.Equal(evs, want) {
		t.Errorf("FailedMount events\n%q\nwant\n%q", evs, want)
	}
}

// TestExpandRecovery: recovery from a refused node expansion, as
// upstream's CSI mock specs "recovery should be possible for node-only
// expanded volumes" run it. The claim asks for 2Gi (allocated 2Gi, the PV
// at 2Gi); the driver refuses; the claim says NodeResizeInfeasible. The
// user asks for 1.5Gi instead: the resizer lowers the allocated size and
// marks the claim NodeResizePending again, the PV staying at 2Gi. The node
// grows the volume to the allocated 1.5Gi, never the PV's 2Gi, and the
// claim reports 1.5Gi with its resize status cleared.
func TestExpandRecovery(t *testing.T) {
	e := newExpandEnv(t, false, csitest.Fault{Method: "NodeExpandVolume", Times: 1, Err: status.Error(codes.OutOfRange, "no room for 2Gi")})
	e.setAllocated("2Gi", v1.PersistentVolumeClaimNodeResizePending)
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "grow"}}})
	if err := e.mount(pod); err != nil {
		t.Fatalf("mount with a refused expansion: %v", err)
	}
	if got := e.claimStatus().AllocatedResourceStatuses[v1.ResourceStorage]; got != v1.PersistentVolumeClaimNodeResizeInfeasible {
		t.Fatalf("claim resize status %q after the refusal, want NodeResizeInfeasible", got)
	}

	e.setAllocated("1536Mi", v1.PersistentVolumeClaimNodeResizePending)
	e.waitResizeStatus(t, "")
	if got := e.claimStatus().Capacity[v1.ResourceStorage]; got.Cmp(resource.MustParse("1536Mi")) != 0 {
		t.Errorf("claim capacity %s, want the allocated 1536Mi", got.String())
	}
	if sizes := e.expandSizes(); !slices.Equal(sizes, []int64{2 << 30, 1536 << 20}) {
		t.Errorf("NodeExpandVolume sizes %v, want [2Gi 1536Mi] (the allocated size each time)", sizes)
	}
}

// TestExpandRecoveryAfterFinalError: an online expansion that fails for
// good but is not refused (PermissionDenied) is retried with the
// NodeResizeError condition on the claim; once the user asks for less,
// the next failure is recorded NodeResizeInfeasible, as the kubelet
// records it, so that the resizer can lower the allocated size; the node
// then grows the volume to it (upstream's "recovery should be possible for
// node-only expanded volumes with final error").
func TestExpandRecoveryAfterFinalError(t *testing.T) {
	e := newExpandEnv(t, false)
	e.setAllocated("1Gi", "") // nothing pending: the pod mounts at 1Gi
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "grow"}}})
	if err := e.mount(pod); err != nil {
		t.Fatal(err)
	}
	e.drv.Inject(csitest.Fault{Method: "NodeExpandVolume", Err: status.Error(codes.PermissionDenied, "permission denied for expansion")})
	e.setAllocated("2Gi", v1.PersistentVolumeClaimNodeResizePending)
	e.waitCondition(t, v1.PersistentVolumeClaimNodeResizeError)
	if got := e.claimStatus().AllocatedResourceStatuses[v1.ResourceStorage]; got != v1.PersistentVolumeClaimNodeResizeInProgress {
		t.Fatalf("claim resize status %q after a final error, want NodeResizeInProgress (retried)", got)
	}

	claims := e.client.CoreV1().PersistentVolumeClaims("ns")
	pvc, err := claims.Get(context.Background(), "grow", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pvc.Spec.Resources.Requests = v1.ResourceList{v1.ResourceStorage: resource.MustParse("1536Mi")}
	if _, err := claims.Update(context.Background(), pvc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitResizeStatus(t, v1.PersistentVolumeClaimNodeResizeInfeasible)

	e.drv.ClearFaults()
	e.setAllocated("1536Mi", v1.PersistentVolumeClaimNodeResizePending)
	e.waitResizeStatus(t, "")
	if got := e.claimStatus().Capacity[v1.ResourceStorage]; got.Cmp(resource.MustParse("1536Mi")) != 0 {
		t.Errorf("claim capacity %s, want the allocated 1536Mi", got.String())
	}
	if sizes := e.expandSizes(); len(sizes) < 2 || sizes[len(sizes)-1] != 1536<<20 || slices.ContainsFunc(sizes[:len(sizes)-1], func(n int64) bool { return n != 2<<30 }) {
		t.Errorf("NodeExpandVolume sizes %v, want 2Gi until the recovery, then 1536Mi", sizes)
	}
}

// setAllocated sets the claim's allocated size and storage resize status
// ("" for none), as the external-resizer does.
func (e *expandEnv) setAllocated(allocated string, st v1.ClaimResourceStatus) {
	e.t.Helper()
	claims := e.client.CoreV1().PersistentVolumeClaims("ns")
	pvc, err := claims.Get(context.Background(), "grow", metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	pvc.Status.AllocatedResources = v1.ResourceList{v1.ResourceStorage: resource.MustParse(allocated)}
	pvc.Status.AllocatedResourceStatuses = nil
	if st != "" {
		pvc.Status.AllocatedResourceStatuses = map[v1.ResourceName]v1.ClaimResourceStatus{v1.ResourceStorage: st}
	}
	if _, err := claims.UpdateStatus(context.Background(), pvc, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// waitClaim waits until the claim's status satisfies done, and shows the
// last status read when it does not.
func (e *expandEnv) waitClaim(t *testing.T, what string, done func(v1.PersistentVolumeClaimStatus) bool) {
	t.Helper()
	var st v1.PersistentVolumeClaimStatus
	defer func() {
		if t.Failed() {
			t.Logf("last claim status read: %+v", st)
		}
	}()
	eventually(t, "claim "+what, func() bool {
		st = e.claimStatus()
		return done(st)
	})
}

// waitResizeStatus waits for the claim's storage resize status ("": none).
func (e *expandEnv) waitResizeStatus(t *testing.T, want v1.ClaimResourceStatus) {
	t.Helper()
	e.waitClaim(t, fmt.Sprintf("resize status %q", want), func(st v1.PersistentVolumeClaimStatus) bool {
		return st.AllocatedResourceStatuses[v1.ResourceStorage] == want
	})
}

// waitCondition waits for the claim's condition c.
func (e *expandEnv) waitCondition(t *testing.T, c v1.PersistentVolumeClaimConditionType) {
	t.Helper()
	e.waitClaim(t, "condition "+string(c), func(st v1.PersistentVolumeClaimStatus) bool {
		return slices.ContainsFunc(st.Conditions, func(x v1.PersistentVolumeClaimCondition) bool { return x.Type == c && x.Status == v1.ConditionTrue })
	})
}

// expandSizes are the sizes NodeExpandVolume was asked for, in order.
func (e *expandEnv) expandSizes() []int64 {
	var sizes []int64
	for _, r := range requests[*csi.NodeExpandVolumeRequest](e.drv, "NodeExpandVolume") {
		sizes = append(sizes, r.GetCapacityRange().GetRequiredBytes())
	}
	return sizes
}
