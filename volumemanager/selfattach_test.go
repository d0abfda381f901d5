package volumemanager

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/mount-utils"
	"k8s.io/utils/ptr"

	"github.com/nodevol/nodevol/csiplugin"
	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/registration"
	"github.com/nodevol/nodevol/volume"
)

// TestSelfAttach: with Config.SelfAttach the node creates the
// VolumeAttachment (name, spec and source as the attach/detach controller
// writes them), the test kit's fake attacher attaches it, the volume is
// staged with its publish context, the pod gets the kubelet's
// SuccessfulAttachVolume, and after the pod goes the VolumeAttachment is
// deleted only once the volume is unstaged.
func TestSelfAttach(t *testing.T) {
	client := fake.NewClientset()
	var unstagesAtDelete atomic.Int64
	unstagesAtDelete.Store(-1)
	// The reactor goes in before the informers start (the reactor chain
	// is not safe to change while they read it); it finds the driver
	// through unstages, set once the env exists.
	var unstages atomic.Pointer[func() int]
	client.PrependReactor("delete", "volumeattachments", func(clienttesting.Action) (bool, runtime.Object, error) {
		if n := unstages.Load(); n != nil {
			unstagesAtDelete.Store(int64((*n)()))
		}
		return false, nil, nil
	})
	e := newEnv(t, envOptions{attachRequired: true, selfAttach: true, client: client})
	countUnstages := func() int { return e.drv.Calls("NodeUnstageVolume") }
	unstages.Store(&countUnstages)
	csitest.NewFakeAttacher(t, client, csitest.AttacherOptions{Driver: e.drv.DriverName(), Metadata: map[string]string{"dev": "/dev/x"}})
	pvName := e.claim("vol")
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "vol"}}})
	if err := e.mount(pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	name := csiplugin.AttachmentName("handle-vol", e.drv.DriverName(), node)
	va, err := client.StorageV1().VolumeAttachments().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := storagev1.VolumeAttachmentSpec{Attacher: e.drv.DriverName(), NodeName: node, Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName}}
	if diff := cmp.Diff(want, va.Spec); diff != "" {
		t.Errorf("VolumeAttachment spec (-want +got):\n%s", diff)
	}
	if !va.Status.Attached {
		t.Errorf("VolumeAttachment status %+v", va.Status)
	}
	// The kubelet's event of an attach it made, the space after the name
	// included.
	select {
	case ev := <-e.events.Events:
		if want := `Normal SuccessfulAttachVolume AttachVolume.Attach succeeded for volume "` + pvName + `" `; ev != want {
			t.Errorf("event %q\nwant  %q", ev, want)
		}
	default:
		t.Error("no SuccessfulAttachVolume event")
	}
	stage := e.drv.Requests()
	for _, r := range stage {
		if r.Method == "NodeStageVolume" {
			if pc := r.Req.(interface{ GetPublishContext() map[string]string }).GetPublishContext(); pc["dev"] != "/dev/x" {
				t.Errorf("NodeStageVolume publish context = %v", pc)
			}
		}
	}

	e.unmount(pod)
	eventually(t, "VolumeAttachment deleted", func() bool {
		_, err := client.StorageV1().VolumeAttachments().Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	if got := unstagesAtDelete.Load(); got != 1 {
		t.Errorf("VolumeAttachment deleted after %d NodeUnstageVolume calls, want after the one", got)
	}
	eventually(t, "volume forgotten", func() bool { return len(e.vm.GetVolumesInUse()) == 0 })
	var creates, deletes int
	for _, a := range client.Actions() {
		if a.GetResource().Resource == "volumeattachments" {
			switch a.GetVerb() {
			case "create":
				creates++
			case "delete":
				deletes++
			}
		}
	}
	if creates != 1 || deletes != 1 {
		t.Errorf("VolumeAttachment creates %d, deletes %d; want 1 and 1", creates, deletes)
	}
}

// TestSelfAttachOtherNode: a VolumeAttachment of the volume's name that
// belongs to another node is a clear error (FailedAttachVolume), is not
// adopted or deleted, and nothing is staged.
func TestSelfAttachOtherNode(t *testing.T) {
	client := fake.NewClientset()
	e := newEnv(t, envOptions{attachRequired: true, selfAttach: true, client: client})
	e.claim("vol")
	name := csiplugin.AttachmentName("handle-vol", e.drv.DriverName(), node)
	other := csitest.VolumeAttachment(name, e.drv.DriverName(), "pv-vol", "node-2", true)
	e.create(other)
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "vol"}}})
	err := e.mount(pod, 500*time.Millisecond)
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitForAttachAndMount = %v", err)
	}
	for _, s := range []string{"volume_attach failed", `"data"`, e.drv.DriverName(), name, `exists for node "node-2"`} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
	if n := e.drv.Calls("NodeStageVolume"); n != 0 {
		t.Errorf("NodeStageVolume called %d times", n)
	}
	select {
	case ev := <-e.events.Events:
		if !strings.Contains(ev, "Warning FailedAttachVolume") || !strings.Contains(ev, `exists for node "node-2"`) {
			t.Errorf("event %q", ev)
		}
	default:
		t.Error("no FailedAttachVolume event")
	}
	e.unmount(pod)
	eventually(t, "volume forgotten", func() bool { return len(e.vm.GetVolumesInUse()) == 0 })
	got, err := client.StorageV1().VolumeAttachments().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil || got.Spec.NodeName != "node-2" || !got.Status.Attached {
		t.Errorf("the other node's VolumeAttachment: %+v, %v", got, err)
	}
}

// TestSelfAttachNeedsPlugin: Config.SelfAttach with a plugin that cannot
// attach is refused by New.
func TestSelfAttachNeedsPlugin(t *testing.T) {
	_, err := New(Config{NodeName: node, KubeClient: fake.NewClientset(), RootDir: t.TempDir(), SelfAttach: true, Plugin: noSelfAttach{}})
	if err == nil || !strings.Contains(err.Error(), "SelfAttach") {
		t.Errorf("New = %v", err)
	}
}

type noSelfAttach struct{ volume.Plugin }

// TestSetNodeAttachMode: the helper sets the Node annotation as the
// manager's attach mode says.
func TestSetNodeAttachMode(t *testing.T) {
	for _, self := range []bool{false, true} {
		vm, err := New(Config{NodeName: node, KubeClient: fake.NewClientset(), RootDir: t.TempDir(), SelfAttach: self})
		if err != nil {
			t.Fatal(err)
		}
		n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Annotations: map[string]string{registration.ControllerManagedAttachDetachAnnotation: "true"}}}
		changed := vm.SetNodeAttachMode(n)
		_, has := n.Annotations[registration.ControllerManagedAttachDetachAnnotation]
		if changed != self || has == self {
			t.Errorf("SelfAttach %v: changed %v, annotations %v", self, changed, n.Annotations)
		}
	}
}

// TestResourceExhaustedRefreshesAllocatable: a NodeStageVolume failing
// with ResourceExhausted makes the manager ask the driver for its node
// information again at once (its CSIDriver sets a refresh period), and the
// CSINode (created at start) carries the count.
func TestResourceExhaustedRefreshesAllocatable(t *testing.T) {
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true, MaxVolumes: 4})
	pvc, pv := csitest.BoundClaim("ns", "a", csitest.PVSpec{Driver: drv.DriverName(), Handle: "handle-a"})
	csiDriver := csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{})
	csiDriver.Spec.NodeAllocatableUpdatePeriodSeconds = ptr.To[int64](3600)
	client := fake.NewClientset(csiDriver, pvc, pv, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"}})
	root := csitest.SocketDir(t) // the registrar's socket goes in root/plugins_registry
	vm, err := New(Config{NodeName: node, KubeClient: client, RootDir: root, Mounter: mount.NewFakeMounter(nil), PluginRegistration: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- vm.Run(ctx) }()
	defer func() { cancel(); <-done }()
	eventually(t, "CSINode created at start", func() bool {
		cn, err := client.StorageV1().CSINodes().Get(ctx, node, metav1.GetOptions{})
		return err == nil && len(cn.OwnerReferences) == 1 && cn.OwnerReferences[0].UID == "node-uid" && len(cn.Spec.Drivers) == 0
	})
	dir := filepath.Join(root, "plugins_registry")
	eventually(t, "registration directory created", func() bool { _, err := os.Stat(dir); return err == nil })
	reg, err := csitest.StartRegistrar(csitest.RegistrarConfig{Dir: dir, DriverName: drv.DriverName(), Endpoint: drv.Endpoint()})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Stop()
	if s, err := reg.WaitForStatus(ctx, 1); err != nil || !s.Registered {
		t.Fatalf("registration status %+v, %v", s, err)
	}
	if n := drv.Calls("NodeGetInfo"); n != 1 {
		t.Fatalf("NodeGetInfo called %d times at registration", n)
	}
	drv.Inject(csitest.Fault{Method: "NodeStageVolume", Err: status.Error(codes.ResourceExhausted, "too many volumes"), Times: 1})
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "a"}}})
	vm.AddPod(pod)
	if err := vm.WaitForAttachAndMount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	eventually(t, "NodeGetInfo after ResourceExhausted", func() bool { return drv.Calls("NodeGetInfo") == 2 })
	cn, err := client.StorageV1().CSINodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil || len(cn.Spec.Drivers) != 1 || cn.Spec.Drivers[0].Allocatable == nil || *cn.Spec.Drivers[0].Allocatable.Count != 4 {
		t.Errorf("CSINode %+v, %v", cn, err)
	}
}

// TestSelfAttachAdoptsAttachmentWithNothingOnDisk: a VolumeAttachment the
// node created in an earlier run whose volume left nothing on disk (a stop
// between the create and the stage) is taken in at start, kept until the
// pods are synced, then deleted since no pod wants it. Attachments of
// other nodes, or not named as the node names its own, are left alone.
func TestSelfAttachAdoptsAttachmentWithNothingOnDisk(t *testing.T) {
	driver := csitest.DefaultDriverName
	pvc, pv := csitest.BoundClaim("ns", "vol", csitest.PVSpec{Driver: driver, Handle: "handle-vol"})
	own := csitest.VolumeAttachment(csiplugin.AttachmentName("handle-vol", driver, node), driver, pv.Name, node, true)
	other := csitest.VolumeAttachment(csiplugin.AttachmentName("handle-vol", driver, "node-2"), driver, pv.Name, "node-2", true)
	stranger := csitest.VolumeAttachment("made-by-hand", driver, pv.Name, node, true)
	e := newEnv(t, envOptions{attachRequired: true, selfAttach: true, objects: []runtime.Object{pvc, pv, own, other, stranger}})
	ctx := context.Background()
	<-e.vm.ready
	waitIdle(t, e.vm)
	if _, err := e.client.StorageV1().VolumeAttachments().Get(ctx, own.Name, metav1.GetOptions{}); err != nil {
		t.Fatalf("the node's VolumeAttachment before MarkPodsSynced: %v, want kept", err)
	}
	e.vm.MarkPodsSynced()
	eventually(t, "the node's VolumeAttachment deleted", func() bool {
		_, err := e.client.StorageV1().VolumeAttachments().Get(ctx, own.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	for _, va := range []*storagev1.VolumeAttachment{other, stranger} {
		if _, err := e.client.StorageV1().VolumeAttachments().Get(ctx, va.Name, metav1.GetOptions{}); err != nil {
			t.Errorf("VolumeAttachment %s: %v, want left alone", va.Name, err)
		}
	}
}
