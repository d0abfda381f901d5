package volumemanager

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/podvol"
)

// TestExpansionClaim: the facts a node expansion is decided on are the PV
// of a volume whose plugin grows volumes on the node (volume.Expander: a
// CSI or migrated in-tree PV) and the claim bound to it; none otherwise. The
// decision itself is the planner's (its TestPendingExpansion).
func TestExpansionClaim(t *testing.T) {
	pv := func(csiSource bool, claimRef bool) *v1.PersistentVolume {
		p := csitest.PV("pv", csitest.PVSpec{Driver: "d.example.com", Handle: "h", Capacity: "2Gi"})
		if claimRef {
			p.Spec.ClaimRef = &v1.ObjectReference{Namespace: "ns", Name: "c"}
		}
		if !csiSource {
			p.Spec.CSI = nil
			p.Spec.NFS = &v1.NFSVolumeSource{Server: "s", Path: "/"}
		}
		return p
	}
	tests := []struct {
		name string
		objs []any
		want bool
	}{
		{"CSI PV bound to its claim", []any{pv(true, true), csitest.PVC("ns", "c", "pv")}, true},
		{"claim bound to another PV", []any{pv(true, true), csitest.PVC("ns", "c", "other")}, false},
		{"claim missing", []any{pv(true, true)}, false},
		{"PV without a claim", []any{pv(true, false), csitest.PVC("ns", "c", "pv")}, false},
		{"PV missing", []any{csitest.PVC("ns", "c", "pv")}, false},
		{"PV of another kind", []any{pv(false, true), csitest.PVC("ns", "c", "pv")}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := &podvol.VolumeSpec{Name: podvol.CSIVolumeName("d.example.com", "h"), PVName: "pv"}
			if tt.name == "PV of another kind" {
				spec.Name = "kubernetes.io/nfs/pv"
			}
			gotPV, gotPVC := testResolver(t, tt.objs...).ExpansionClaim(spec)
			if got := gotPV != nil && gotPVC != nil; got != tt.want || (gotPV == nil) != (gotPVC == nil) {
				t.Errorf("expansionClaim = %v, %v; want both found %v", gotPV, gotPVC, tt.want)
			}
		})
	}
}

// TestOnlineExpansion: the controller grows a mounted volume's PV and marks
// its claim FileSystemResizePending; nodevol calls NodeExpandVolume with the
// pod's volume path, the staging path and the new size, then records the
// new capacity on the claim and clears the condition; with informers
// (Config.ClusterInformers) at once, with the object cache (the default)
// at the claim's and volume's next read (a short ResyncPeriod here).
func TestOnlineExpansion(t *testing.T) {
	for name, o := range map[string]envOptions{
		"informers":    {clusterInformers: true},
		"object cache": {resyncPeriod: 50 * time.Millisecond},
	} {
		t.Run(name, func(t *testing.T) {
			o.driver = csitest.Options{Expand: true}
			onlineExpansion(t, newEnv(t, o))
		})
	}
}

func onlineExpansion(t *testing.T, e *env) {
	pvName := e.claimWith("a", csitest.PVSpec{Capacity: "1Gi"})
	ctx := context.Background()
	pvc, err := e.client.CoreV1().PersistentVolumeClaims("ns").Get(ctx, "a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pvc.Status.Capacity = v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")}
	if pvc, err = e.client.CoreV1().PersistentVolumeClaims("ns").UpdateStatus(ctx, pvc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "a"}}})
	if err := e.mount(pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if n := e.drv.Calls("NodeExpandVolume"); n != 0 {
		t.Fatalf("NodeExpandVolume called %d times before any resize", n)
	}

	// The external-resizer's part: PV grown, claim marked.
	pv, err := e.client.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv.Spec.Capacity[v1.ResourceStorage] = resource.MustParse("2Gi")
	if _, err := e.client.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pvc.Status.Conditions = []v1.PersistentVolumeClaimCondition{{Type: v1.PersistentVolumeClaimFileSystemResizePending, Status: v1.ConditionTrue}}
	if _, err := e.client.CoreV1().PersistentVolumeClaims("ns").UpdateStatus(ctx, pvc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	eventually(t, "claim reports the new size", func() bool {
		c, err := e.client.CoreV1().PersistentVolumeClaims("ns").Get(ctx, "a", metav1.GetOptions{})
		got := c.Status.Capacity[v1.ResourceStorage]
		return err == nil && got.Cmp(resource.MustParse("2Gi")) == 0 && len(c.Status.Conditions) == 0
	})
	req := e.drv.Requests()
	var exp *csi.NodeExpandVolumeRequest
	for _, r := range req {
		if r.Method == "NodeExpandVolume" {
			exp = r.Req.(*csi.NodeExpandVolumeRequest)
		}
	}
	vols := e.vm.GetMountedVolumesForPod(pod.UID)
	if exp == nil || len(vols) != 1 {
		t.Fatalf("NodeExpandVolume request %v, mounted %v", exp, vols)
	}
	if exp.GetVolumeId() != "handle-a" || exp.GetVolumePath() != vols[0].Path || exp.GetStagingTargetPath() == "" ||
		exp.GetCapacityRange().GetRequiredBytes() != 2<<30 || exp.GetVolumeCapability().GetMount() == nil {
		t.Errorf("NodeExpandVolume request %v: want handle-a at %s, staged, 2Gi, a mount capability", exp, vols[0].Path)
	}
	if n := e.drv.Calls("NodeExpandVolume"); n != 1 {
		t.Errorf("NodeExpandVolume called %d times, want 1", n)
	}
}

// TestOnlineExpansionEvents: the events of an online expansion, in the
// kubelet's words: FileSystemResizeSuccessful on the pod and on the claim
// when it is grown ("MountVolume.NodeExpandVolume succeeded for volume
// <pv> <node>"); VolumeResizeFailed on the pod when NodeExpandVolume fails
// (the kubelet's online expansion's event), retried, or infeasible, which
// is not; FileSystemResizeFailed when the driver cannot expand the volume
// in use (FailedPrecondition, which the kubelet only logs), in the words
// of its refusal of a read-only volume.
func TestOnlineExpansionEvents(t *testing.T) {
	const pod, claim = " involvedObject{kind=Pod,apiVersion=v1}", " involvedObject{kind=PersistentVolumeClaim,apiVersion=v1}"
	grown := `Normal FileSystemResizeSuccessful MountVolume.NodeExpandVolume succeeded for volume "{pv}" node-1`
	tests := []struct {
		name  string
		fault *csitest.Fault
		want  []string
	}{
		{"grown", nil, []string{grown + pod, grown + claim}},
		{"failed, then grown", &csitest.Fault{Method: "NodeExpandVolume", Times: 1, Err: status.Error(codes.Internal, "resize2fs crashed")}, []string{
			`Warning VolumeResizeFailed NodeExpandVolume.NodeExpandVolume failed for volume "{pv}" : Expander.NodeExpand failed to expand the volume : ` +
				`rpc error: code = Internal desc = resize2fs crashed` + pod,
			grown + pod, grown + claim}},
		{"infeasible", &csitest.Fault{Method: "NodeExpandVolume", Err: status.Error(codes.OutOfRange, "too big")}, []string{
			`Warning VolumeResizeFailed NodeExpandVolume.NodeExpandVolume failed for volume "{pv}" : Expander.NodeExpand failed to expand the volume ` +
				`rpc error: code = OutOfRange desc = too big` + pod}},
		{"in use", &csitest.Fault{Method: "NodeExpandVolume", Err: status.Error(codes.FailedPrecondition, "not while mounted")}, []string{
			`Warning FileSystemResizeFailed MountVolume.NodeExpandVolume failed for volume "{pv}" : Expander.NodeExpand failed to expand the volume : ` +
				`rpc error: code = FailedPrecondition desc = not while mounted` + pod}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, envOptions{driver: csitest.Options{Expand: true}, events: newObjectRecorder(100), clusterInformers: true})
			pvName := e.claimWith("a", csitest.PVSpec{Capacity: "1Gi"})
			ctx := context.Background()
			pvc, err := e.client.CoreV1().PersistentVolumeClaims("ns").Get(ctx, "a", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			pvc.Status.Capacity = v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")}
			if pvc, err = e.client.CoreV1().PersistentVolumeClaims("ns").UpdateStatus(ctx, pvc, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := e.mount(csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{
				{Name: "data", Claim: "a"},
			}}), 10*time.Second); err != nil {
				t.Fatal(err)
			}
			if tt.fault != nil {
				e.drv.Inject(*tt.fault)
			}
			pv, err := e.client.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			pv.Spec.Capacity[v1.ResourceStorage] = resource.MustParse("2Gi")
			if _, err := e.client.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			pvc.Status.Conditions = []v1.PersistentVolumeClaimCondition{{Type: v1.PersistentVolumeClaimFileSystemResizePending, Status: v1.ConditionTrue}}
			if _, err := e.client.CoreV1().PersistentVolumeClaims("ns").UpdateStatus(ctx, pvc, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			var got []string
			eventually(t, "the expansion's events", func() bool {
				for len(e.events.Events) > 0 {
					got = append(got, <-e.events.Events)
				}
				return len(got) >= len(tt.want)
			})
			want := make([]string, len(tt.want))
			for i, w := range tt.want {
				want[i] = strings.ReplaceAll(w, "{pv}", pvName)
			}
			if !slices.Equal(got, want) {
				t.Errorf("events\n%q\nwant\n%q", got, want)
			}
		})
	}
}
