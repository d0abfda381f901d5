package volumemanager

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"
	"k8s.io/utils/ptr"

	"github.com/nodevol/nodevol/csiplugin"
	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// attachLimitEnv is a manager with plugin registration, a registered
// driver that reports 4 volumes at registration, and the VolumeAttachment
// of claim "a"'s volume failed with ResourceExhausted.
type attachLimitEnv struct {
	vm     *VolumeManager
	client kubernetes.Interface
	drv    *csitest.Server
	va     *storagev1.VolumeAttachment
	ctx    context.Context
}

func newAttachLimitEnv(t *testing.T, period *int64) *attachLimitEnv {
	t.Helper()
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true, MaxVolumes: 4})
	pvc, pv := csitest.BoundClaim("ns", "a", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-a"})
	csiDriver := csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{AttachRequired: true})
	csiDriver.Spec.NodeAllocatableUpdatePeriodSeconds = period
	va := csitest.VolumeAttachment(csiplugin.AttachmentName("handle-a", drv.DriverName(), node), drv.DriverName(), pv.Name, node, false)
	va.Status.AttachError = &storagev1.VolumeError{Message: "too many disks attached", ErrorCode: ptr.To(int32(codes.ResourceExhausted))}
	client := fake.NewClientset(csiDriver, pvc, pv, va, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"}})
	root := csitest.SocketDir(t)
	vm, err := New(Config{NodeName: node, KubeClient: client, RootDir: root, Mounter: mount.NewFakeMounter(nil), PluginRegistration: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	done := make(chan error, 1)
	go func() { done <- vm.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	dir := filepath.Join(root, "plugins_registry")
	eventually(t, "registration directory created", func() bool { _, err := os.Stat(dir); return err == nil })
	reg, err := csitest.StartRegistrar(csitest.RegistrarConfig{Dir: dir, DriverName: drv.DriverName(), Endpoint: drv.Endpoint()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Stop)
	if s, err := reg.WaitForStatus(ctx, 1); err != nil || !s.Registered {
		t.Fatalf("registration status %+v, %v", s, err)
	}
	if n := drv.Calls("NodeGetInfo"); n != 1 {
		t.Fatalf("NodeGetInfo called %d times at registration", n)
	}
	return &attachLimitEnv{vm: vm, client: client, drv: drv, va: va, ctx: ctx}
}

// count is the driver's allocatable count in the CSINode (0: none).
func (e *attachLimitEnv) count() int32 {
	cn, err := e.client.StorageV1().CSINodes().Get(e.ctx, node, metav1.GetOptions{})
	if err != nil || len(cn.Spec.Drivers) != 1 || cn.Spec.Drivers[0].Allocatable == nil {
		return 0
	}
	return *cn.Spec.Drivers[0].Allocatable.Count
}

// expiredWait is WaitForAttachAndMount with a context whose deadline has
// passed: the end of a wait that ran out of time.
func (e *attachLimitEnv) expiredWait(pod *v1.Pod) error {
	ctx, cancel := context.WithDeadline(e.ctx, time.Now().Add(-time.Second))
	defer cancel()
	return e.vm.WaitForAttachAndMount(ctx, pod)
}

// TestAttachLimitExceeded: a VolumeAttachment that failed with
// ResourceExhausted (status.attachError.errorCode 8) refreshes the
// driver's CSINode allocatable count at once (NodeGetInfo) and makes a
// wait that runs out of time final with a *VolumeAttachLimitExceededError
// (reason VolumeAttachmentLimitExceeded), when the driver's CSIDriver sets
// nodeAllocatableUpdatePeriodSeconds; without it, as the kubelet, no
// refresh and a plain timeout naming the attach error.
func TestAttachLimitExceeded(t *testing.T) {
	tests := []struct {
		name   string
		period *int64
		limit  bool
	}{
		{"driver with an allocatable update period", ptr.To[int64](3600), true},
		{"driver without", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newAttachLimitEnv(t, tt.period)
			e.drv.SetMaxVolumes(2)
			pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "a"}}})
			e.vm.AddPod(pod)
			var err error
			eventually(t, "the attach error in the wait's error", func() bool {
				err = e.expiredWait(pod)
				return err != nil && strings.Contains(err.Error(), "too many disks attached")
			})
			var limit *VolumeAttachLimitExceededError
			if errors.As(err, &limit) != tt.limit || errors.Is(err, ErrFinal) != tt.limit || errors.Is(err, context.DeadlineExceeded) == tt.limit {
				t.Fatalf("wait error %v (%#v): want attach limit %v", err, err, tt.limit)
			}
			if !tt.limit {
				if n, c := e.drv.Calls("NodeGetInfo"), e.count(); n != 1 || c != 4 {
					t.Errorf("NodeGetInfo called %d times, count %d: want no refresh (1, 4)", n, c)
				}
				return
			}
			want := VolumeAttachLimitExceededError{Pod: "ns/p", Volume: "data", Driver: e.drv.DriverName(),
				VolumeAttachment: e.va.Name, Message: "too many disks attached", Err: limit.Err}
			if *limit != want || limit.Reason() != "VolumeAttachmentLimitExceeded" || !strings.Contains(err.Error(), "VolumeAttachmentLimitExceeded") {
				t.Errorf("limit error %+v (%v), want %+v", *limit, err, want)
			}
			eventually(t, "CSINode count refreshed to 2", func() bool { return e.count() == 2 })
		})
	}
}

// TestAttachLimitPassingExhaustion: a wait started while the
// VolumeAttachment shows ResourceExhausted is not final on that error: the
// attacher retries, and once it attaches the volume the pod mounts.
func TestAttachLimitPassingExhaustion(t *testing.T) {
	e := newAttachLimitEnv(t, ptr.To[int64](3600))
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "a"}}})
	e.vm.AddPod(pod)
	eventually(t, "the attach limit seen", func() bool {
		var limit *VolumeAttachLimitExceededError
		return errors.As(e.expiredWait(pod), &limit)
	})
	done := make(chan error, 1)
	go func() { done <- e.vm.WaitForAttachAndMount(e.ctx, pod) }()
	va := e.va.DeepCopy()
	va.Status = storagev1.VolumeAttachmentStatus{Attached: true}
	if _, err := e.client.StorageV1().VolumeAttachments().UpdateStatus(e.ctx, va, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("wait after the attacher attached the volume: %v", err)
	}
}
