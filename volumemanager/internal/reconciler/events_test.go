package reconciler

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/record"
	fakeclock "k8s.io/utils/clock/testing"

	"github.com/nodevol/nodevol/csi"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	oe "github.com/nodevol/nodevol/volumemanager/internal/operationexecutor"
	"github.com/nodevol/nodevol/volumemanager/internal/planner"
	"github.com/nodevol/nodevol/volumemanager/internal/state"
)

// newObjectRecorder is a FakeRecorder whose events name the kind of their
// object: "Warning FailedMount ... involvedObject{kind=Pod,apiVersion=v1}".
func newObjectRecorder(n int) *record.FakeRecorder {
	r := record.NewFakeRecorder(n)
	r.IncludeObject = true
	return r
}

// TestFailureEventWords: the event of each failed operation, of each mode
// and of each part of it that the kubelet words apart, in the kubelet
// v1.37.2's words (operation_generator.go): its reason, then "<step> for
// volume "<name>" : <cause>", the volume named as the kubelet's volume
// spec names it (the PV, else the pod's name of the volume; the unique
// name for an unmount), the cause what the plugin marked as the kubelet's
// (volume.Cause, WithCause, AtStep, a CSI call's gRPC status), else the
// plugin's own text; on the pod, or on the Node for an unstage and a
// self-detach (nodevol's, which the kubelet does not record). The errors
// reach the loop as Do returns them: wrapped by oe.OpError.
func TestFailureEventWords(t *testing.T) {
	pod := podvol.PodVolume{Pod: podvol.PodRef{UID: "uid-web", Namespace: "ns", Name: "web"}, SpecName: "data"}
	pv := podvol.VolumeSpec{Name: "kubernetes.io/csi/drv^h", PVName: "pv-1", Driver: "drv", VolumeHandle: "h", Mode: podvol.Filesystem}
	block := pv
	block.Mode = podvol.Block
	cm := podvol.VolumeSpec{Name: "kubernetes.io/configmap/uid-web-cm", Plugin: "kubernetes.io/configmap", Ephemeral: true, Mode: podvol.Filesystem}
	inline := podvol.VolumeSpec{Name: "kubernetes.io/csi/drv^inline-h", Driver: "drv", VolumeHandle: "inline-h", Ephemeral: true, Mode: podvol.Filesystem}
	// A driver's error as the CSI client returns it, inside the plugin's
	// context.
	grpcErr := func(method string, code codes.Code, msg string) error {
		return fmt.Errorf("staging volume %q (PV pv-1, driver drv) at /x: %w", pv.Name,
			&csi.CallError{Driver: "drv", Method: method, Code: code, Err: status.Error(code, msg)})
	}
	const onPod, onNode = " involvedObject{kind=Pod,apiVersion=v1}", " involvedObject{kind=Node,apiVersion=v1}"
	tests := []struct {
		name string
		kind oe.OpKind
		spec podvol.VolumeSpec
		vol  podvol.PodVolume // the pod's volume; zero: pod
		err  error            // the plugin's
		want string
	}{
		{"attach confirmed", oe.OpAttach, pv, pod, volume.WithCause(errors.New("attaching volume ... failed (VolumeAttachment csi-x): disk is on fire"), "disk is on fire"),
			`Warning FailedMount MountVolume.WaitForAttach failed for volume "pv-1" : disk is on fire` + onPod},
		{"attach confirmed, block", oe.OpAttach, block, pod, volume.WithCause(errors.New("VolumeAttachment csi-x is being deleted"), "volume attachment is being deleted"),
			`Warning FailedMapVolume MapVolume.WaitForAttach failed for volume "pv-1" : volume attachment is being deleted` + onPod},
		{"self-attach", oe.OpSelfAttach, pv, pod, volume.WithCause(errors.New("creating VolumeAttachment csi-x: forbidden"), "kubernetes.io/csi: attacher.Attach failed: forbidden"),
			`Warning FailedAttachVolume AttachVolume.Attach failed for volume "pv-1" : kubernetes.io/csi: attacher.Attach failed: forbidden` + onPod},
		{"stage", oe.OpStage, pv, pod, grpcErr("NodeStageVolume", codes.Internal, "disk on fire"),
			`Warning FailedMount MountVolume.MountDevice failed for volume "pv-1" : rpc error: code = Internal desc = disk on fire` + onPod},
		{"stage, block", oe.OpStage, block, pod, grpcErr("NodeStageVolume", codes.Internal, "disk on fire"),
			`Warning FailedMapVolume MapVolume.SetUpDevice failed for volume "pv-1" : rpc error: code = Internal desc = disk on fire` + onPod},
		{"stage in progress", oe.OpStage, pv, pod, grpcErr("NodeStageVolume", codes.DeadlineExceeded, "context deadline exceeded"),
			`Warning FailedMount MountVolume.MountDevice failed for volume "pv-1" : rpc error: code = DeadlineExceeded desc = context deadline exceeded` + onPod},
		{"publish", oe.OpPublish, pv, pod, grpcErr("NodePublishVolume", codes.NotFound, "no volume h"),
			`Warning FailedMount MountVolume.SetUp failed for volume "pv-1" : rpc error: code = NotFound desc = no volume h` + onPod},
		{"publish of an inline volume: the pod's name", oe.OpPublish, inline, pod, grpcErr("NodePublishVolume", codes.Internal, "boom"),
			`Warning FailedMount MountVolume.SetUp failed for volume "data" : rpc error: code = Internal desc = boom` + onPod},
		{"publish of a configMap", oe.OpPublish, cm, podvol.PodVolume{Pod: pod.Pod, SpecName: "cm"},
			fmt.Errorf("setting up configMap volume \"cm\" of pod ns/web: %w", volume.Cause(apierrors.NewNotFound(schema.GroupResource{Resource: "configmap"}, "cm-x"))),
			`Warning FailedMount MountVolume.SetUp failed for volume "cm" : configmap "cm-x" not found` + onPod},
		{"publish, no kubelet's words: the plugin's own", oe.OpPublish, cm, podvol.PodVolume{Pod: pod.Pod, SpecName: "cm"},
			errors.New(`setting up configMap volume "cm" of pod ns/web: key "a/b": invalid path`),
			`Warning FailedMount MountVolume.SetUp failed for volume "cm" : setting up configMap volume "cm" of pod ns/web: key "a/b": invalid path` + onPod},
		{"publish, block", oe.OpPublish, block, pod, grpcErr("NodePublishVolume", codes.Internal, "boom"),
			`Warning FailedMapVolume MapVolume.MapPodDevice failed for volume "pv-1" : rpc error: code = Internal desc = boom` + onPod},
		{"publish, block: the node's map", oe.OpPublish, block, pod, volume.AtStep(volume.StepMapBlockVolume, errors.New("mapping block volume: losetup: no loop device")),
			`Warning FailedMapVolume MapVolume.MapBlockVolume failed for volume "pv-1" : mapping block volume: losetup: no loop device` + onPod},
		{"expansion while mounting", oe.OpPublish, pv, pod, &ExpandError{volume.WithCause(errors.New("expanding: Internal"), "Expander.NodeExpand failed to expand the volume : rpc error: code = Internal desc = x")},
			`Warning FailedMount MountVolume.Setup failed while expanding volume for volume "pv-1" : Expander.NodeExpand failed to expand the volume : rpc error: code = Internal desc = x` + onPod},
		{"expansion while mapping", oe.OpPublish, block, pod, &ExpandError{errors.New("boom")},
			`Warning FailedMapVolume MapVolume.MarkVolumeAsMounted failed while expanding volume for volume "pv-1" : boom` + onPod},
		{"online expansion", oe.OpExpand, pv, pod, grpcErr("NodeExpandVolume", codes.Internal, "resize2fs crashed"),
			`Warning VolumeResizeFailed NodeExpandVolume.NodeExpandVolume failed for volume "pv-1" : rpc error: code = Internal desc = resize2fs crashed` + onPod},
		{"unpublish: the unique name", oe.OpUnpublish, pv, pod, volume.WithCause(errors.New("unpublishing: Internal"), "kubernetes.io/csi: Unmounter.TearDownAt failed: rpc error: code = Internal desc = busy"),
			`Warning FailedUnMount UnmountVolume.TearDown failed for volume "kubernetes.io/csi/drv^h" : kubernetes.io/csi: Unmounter.TearDownAt failed: rpc error: code = Internal desc = busy` + onPod},
		{"unpublish: its subPath mounts", oe.OpUnpublish, pv, pod, &SubPathError{errors.New("unmount /x/volume-subpaths/data/c/0: device busy")},
			`Warning FailedUnMount error cleaning subPath mounts for volume "kubernetes.io/csi/drv^h" : unmount /x/volume-subpaths/data/c/0: device busy` + onPod},
		{"unpublish, block", oe.OpUnpublish, block, pod, errors.New("boom"),
			`Warning FailedUnmapDevice UnmapVolume.UnmapPodDevice failed for volume "kubernetes.io/csi/drv^h" : boom` + onPod},
		{"unpublish, block: the node's unmap", oe.OpUnpublish, block, pod, volume.AtStep(volume.StepUnmapBlockVolume, errors.New("boom")),
			`Warning FailedUnmapDevice UnmapVolume.UnmapBlockVolume failed for volume "kubernetes.io/csi/drv^h" : boom` + onPod},
		{"unstage", oe.OpUnstage, pv, pod, errors.New("boom"),
			`Warning FailedUnMount UnmountDevice failed for volume "pv-1" : boom` + onNode},
		{"unstage refused: mounts reference it", oe.OpUnstage, pv, pod, fmt.Errorf("unstaging: %w", &volume.InUseError{Path: "/g/globalmount", Refs: []string{"/p/a", "/p/b"}}),
			`Warning FailedUnMount GetDeviceMountRefs check failed for volume "pv-1" : the device mount path "/g/globalmount" is still mounted by other references [/p/a /p/b]` + onNode},
		{"unstage, block", oe.OpUnstage, block, pod, errors.New("boom"),
			`Warning FailedUnmapDevice UnmapDevice.TearDownDevice failed for volume "pv-1" : boom` + onNode},
		{"unstage, block, refused", oe.OpUnstage, block, pod, fmt.Errorf("still published: %w", &volume.InUseError{Path: "/s/pv-1", Refs: []string{"/p/uid"}}),
			`Warning FailedUnmapDevice UnmapDevice failed for volume "pv-1" : the device "/s/pv-1" is still referenced from other Pods [/p/uid]` + onNode},
		{"unstage, block: the map path", oe.OpUnstage, block, pod, volume.AtStep(volume.StepRemoveMapPath, errors.New("/m is still a mount point")),
			`Warning FailedUnmapDevice UnmapDevice.RemoveMapPath failed for volume "pv-1" : /m is still a mount point` + onNode},
		{"self-detach", oe.OpSelfDetach, pv, pod, volume.WithCause(errors.New("detaching: gone wrong"), "gone wrong"),
			`Warning FailedDetachVolume DetachVolume.Detach failed for volume "pv-1" : gone wrong` + onNode},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := newObjectRecorder(10)
			l := New(Config{Node: "node-1", Clock: fakeclock.NewFakeClock(time.Unix(0, 0)), Events: rec, Host: testHost{},
				DSW: state.NewDesiredStateOfWorld(func(podvol.UniqueVolumeName) {}), ASW: state.NewActualStateOfWorld()}, nil, nil)
			l.logger = logr.Discard()
			vol := tt.vol
			a := oe.Action{Kind: tt.kind, Volume: tt.spec.Name}
			switch tt.kind {
			case oe.OpPublish, oe.OpUnpublish, oe.OpExpand:
				a.Pod = vol
			}
			if tt.kind != oe.OpUnstage && tt.kind != oe.OpSelfDetach {
				l.DSW.SetPod(vol.Pod, []string{vol.SpecName}, []state.DesiredVolume{{Spec: tt.spec, Volume: vol}}, nil)
			}
			l.failed(oe.Outcome{Action: a, Spec: tt.spec, Err: oe.OpError(a, tt.spec, tt.err)})
			if len(rec.Events) != 1 {
				t.Fatalf("%d events, want 1", len(rec.Events))
			}
			if ev := <-rec.Events; ev != tt.want {
				t.Errorf("event\n%q\nwant\n%q", ev, tt.want)
			}
		})
	}
}

// TestRefusalEventWords: the event of a pod the planner refuses a volume,
// in the kubelet's words: a ReadWriteOncePod volume in use (its check at
// mount: SetUp, or SetUpDevice for raw block), a lifecycle mode the driver
// does not list (its CSI mounter's), an SELinux context conflict (the
// error of the kubelet's desired state, which it records only as the
// cause of its "Unable to attach or mount volumes"); the volume named by
// its PV, else by the pod.
func TestRefusalEventWords(t *testing.T) {
	p := podvol.PodVolume{Pod: podvol.PodRef{UID: "uid-q", Namespace: "ns", Name: "q"}, SpecName: "data"}
	pv := podvol.VolumeSpec{Name: "kubernetes.io/csi/drv^h", PVName: "pv-1", Driver: "drv", Mode: podvol.Filesystem, AccessMode: "ReadWriteOncePod"}
	block := pv
	block.Mode = podvol.Block
	inline := podvol.VolumeSpec{Name: "kubernetes.io/csi/drv^i", Driver: "drv", Ephemeral: true, Mode: podvol.Filesystem}
	rwop := fmt.Errorf("pod ns/q cannot use volume pv-1 (claim ns/c): %w and is in use by pod ns/p on this node", planner.ErrReadWriteOncePod)
	conflict := &planner.SELinuxConflictError{Volume: pv.Name, Driver: "drv", Pod: p.Pod, Context: "system_u:object_r:container_file_t:s0:c3,c4",
		Other: podvol.PodRef{Namespace: "ns", Name: "p"}, OtherContext: "system_u:object_r:container_file_t:s0:c1,c2"}
	lifecycle := func(mode storagev1.VolumeLifecycleMode, modes ...storagev1.VolumeLifecycleMode) error {
		return fmt.Errorf("pod ns/q cannot use volume x: %w", &planner.LifecycleModeError{Driver: "drv", Mode: mode, Modes: modes})
	}
	tests := []struct {
		name       string
		spec       podvol.VolumeSpec
		err        error
		wantMsg    string
		wantReason string
	}{
		{"ReadWriteOncePod", pv, rwop, `MountVolume.SetUp failed for volume "pv-1" : volume uses the ReadWriteOncePod access mode and is already in use by another pod`, "FailedMount"},
		{"ReadWriteOncePod, block", block, rwop, `MapVolume.SetUpDevice failed for volume "pv-1" : volume uses the ReadWriteOncePod access mode and is already in use by another pod`, "FailedMapVolume"},
		{"SELinux", pv, conflict, `conflicting SELinux labels of volume pv-1: "system_u:object_r:container_file_t:s0:c1,c2" and "system_u:object_r:container_file_t:s0:c3,c4"`, "FailedMount"},
		{"SELinux, with no context", pv, &planner.SELinuxConflictError{Volume: pv.Name, Pod: p.Pod, OtherContext: "system_u:object_r:container_file_t:s0:c1,c2"},
			`conflicting SELinux labels of volume pv-1: "system_u:object_r:container_file_t:s0:c1,c2" and ""`, "FailedMount"},
		{"inline volume, lifecycle", inline, lifecycle(storagev1.VolumeLifecycleEphemeral, storagev1.VolumeLifecyclePersistent),
			`MountVolume.SetUp failed for volume "data" : kubernetes.io/csi: mounter.SetupAt failed to check volume lifecycle mode: volume mode "Ephemeral" not supported by driver drv (only supports ["Persistent"])`, "FailedMount"},
		{"PV, lifecycle", pv, lifecycle(storagev1.VolumeLifecyclePersistent, storagev1.VolumeLifecycleEphemeral),
			`MountVolume.SetUp failed for volume "pv-1" : kubernetes.io/csi: mounter.SetupAt failed to check volume lifecycle mode: volume mode "Persistent" not supported by driver drv (only supports ["Ephemeral"])`, "FailedMount"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reason, msg := refusalEvent(&tt.spec, planner.Refusal{Pod: p, Err: tt.err})
			if reason != tt.wantReason || msg != tt.wantMsg {
				t.Errorf("event %s %q\nwant  %s %q", reason, msg, tt.wantReason, tt.wantMsg)
			}
		})
	}
}
