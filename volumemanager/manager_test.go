package volumemanager

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/nodevol/nodevol/csiplugin"
	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

const node = "node-1"

// env is a running VolumeManager on the fake clientset, the fake mounter
// and the test kit's in-process driver over a real unix socket.
type env struct {
	t      *testing.T
	client *fake.Clientset
	drv    *csitest.Server
	vm     *VolumeManager
	root   string
	events *record.FakeRecorder
	// stop ends Run and waits for it (at the end of the test, or sooner).
	stop func()
}

type envOptions struct {
	objects     []runtime.Object
	driver      csitest.Options
	noRegister  bool
	callTimeout time.Duration
	// clusterInformers sets Config.ClusterInformers; client, if set,
	// replaces the fake clientset made from objects (reactors added first).
	clusterInformers bool
	client           *fake.Clientset
	// attachRequired is the driver's CSIDriver attachRequired;
	// noCSIDriver leaves the driver without a CSIDriver object.
	attachRequired, noCSIDriver bool
	resyncPeriod                time.Duration
	// selfAttach sets Config.SelfAttach; envReadByCaller
	// Config.EnvReadByCaller.
	selfAttach, envReadByCaller bool
	// clock and claimGrace set Config.Clock and
	// Config.ClaimPendingGracePeriod; logger, if set, is Run's logger.
	clock      clock.WithTicker
	claimGrace time.Duration
	logger     *klog.Logger
	// events, if set, replaces the FakeRecorder (e.g. with IncludeObject).
	events *record.FakeRecorder
	// plugins sets Config.Plugins; root, if set, is the root directory
	// (a restart on what an earlier env left).
	plugins []volume.Plugin
	root    string
	// mounter, if set, replaces the fake mounter; volumePluginDir, if
	// set, is the flexVolume driver directory (default: an empty one of
	// the test's own).
	mounter         mount.Interface
	volumePluginDir string
	// sizeLimit sets Config.SizeLimit, registerer Config.Registerer.
	sizeLimit  SizeLimitConfig
	registerer prometheus.Registerer
}

func newEnv(t *testing.T, o envOptions) *env {
	t.Helper()
	o.driver.CreateTargetDirs = true
	e := &env{t: t, drv: csitest.New(t, o.driver), root: o.root, events: o.events}
	if e.root == "" {
		e.root = t.TempDir()
	}
	if e.events == nil {
		e.events = record.NewFakeRecorder(100)
	}
	objs := o.objects
	if !o.noCSIDriver {
		objs = append([]runtime.Object{csitest.CSIDriver(e.drv.DriverName(), csitest.CSIDriverSpec{AttachRequired: o.attachRequired})}, objs...)
	}
	e.client = o.client
	if e.client == nil {
		e.client = fake.NewClientset()
	}
	for _, obj := range objs {
		if err := e.client.Tracker().Add(obj); err != nil {
			t.Fatal(err)
		}
	}
	if o.mounter == nil {
		o.mounter = mount.NewFakeMounter(nil)
	}
	if o.volumePluginDir == "" {
		o.volumePluginDir = t.TempDir()
	}
	vm, err := New(Config{
		NodeName:         node,
		KubeClient:       e.client,
		RootDir:          e.root,
		Mounter:          o.mounter,
		VolumePluginDir:  o.volumePluginDir,
		EventRecorder:    e.events,
		CSICallTimeout:   o.callTimeout,
		ClusterInformers: o.clusterInformers,
		ResyncPeriod:     o.resyncPeriod,
		SelfAttach:       o.selfAttach,
		EnvReadByCaller:  o.envReadByCaller,
		Clock:            o.clock,
		Plugins:          o.plugins,
		SizeLimit:        o.sizeLimit,
		Registerer:       o.registerer,

		ClaimPendingGracePeriod: o.claimGrace,
	})
	if err != nil {
		t.Fatal(err)
	}
	e.vm = vm
	ctx, cancel := context.WithCancel(context.Background())
	if o.logger != nil {
		ctx = klog.NewContext(ctx, *o.logger)
	}
	done := make(chan error)
	go func() { done <- vm.Run(ctx) }()
	e.stop = sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	t.Cleanup(e.stop)
	if !o.noRegister {
		e.register()
	}
	return e
}

func (e *env) register() {
	e.t.Helper()
	if err := e.vm.Drivers().Register(context.Background(), e.drv.DriverName(), e.drv.Endpoint()); err != nil {
		e.t.Fatal(err)
	}
}

// claim creates a bound PVC/PV pair in namespace "ns" and returns the PV's name.
func (e *env) claim(name string) string {
	e.t.Helper()
	return e.claimWith(name, csitest.PVSpec{})
}

// claimWith is claim with a volume described by spec, whose driver and
// handle ("handle-"+name) it sets.
func (e *env) claimWith(name string, spec csitest.PVSpec) string {
	e.t.Helper()
	spec.Driver, spec.Handle = e.drv.DriverName(), "handle-"+name
	pvc, pv := csitest.BoundClaim("ns", name, spec)
	e.create(pvc, pv)
	return pv.Name
}

func (e *env) create(objs ...runtime.Object) {
	e.t.Helper()
	ctx := context.Background()
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *v1.PersistentVolumeClaim:
			_, err = e.client.CoreV1().PersistentVolumeClaims(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *v1.PersistentVolume:
			_, err = e.client.CoreV1().PersistentVolumes().Create(ctx, o, metav1.CreateOptions{})
		case *storagev1.VolumeAttachment:
			_, err = e.client.StorageV1().VolumeAttachments().Create(ctx, o, metav1.CreateOptions{})
		case *v1.Secret:
			_, err = e.client.CoreV1().Secrets(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		default:
			e.t.Fatalf("cannot create %T", o)
		}
		if err != nil {
			e.t.Fatal(err)
		}
	}
}

func (e *env) mount(pod *v1.Pod, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	e.vm.AddPod(pod)
	return e.vm.WaitForAttachAndMount(ctx, pod)
}

func (e *env) unmount(pod *v1.Pod) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e.vm.DeletePod(pod)
	if err := e.vm.WaitForUnmount(ctx, pod); err != nil {
		e.t.Fatal(err)
	}
}

// eventually polls cond with a deadline: for observing the result of
// asynchronous work, never for ordering it.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, 10*time.Second, true,
		func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatalf("timed out waiting for %s", what)
	}
}

func TestMountAndUnmountPods(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.claimWith("shared", csitest.PVSpec{AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteMany}})
	ownPV := e.claim("own")
	p1 := csitest.Pod("ns", "p1", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "shared"}}})
	p2 := csitest.Pod("ns", "p2", csitest.PodSpec{Volumes: []csitest.PodVolume{
		{Name: "data", Claim: "shared", ReadOnly: true},
		{Name: "mine", Claim: "own"},
	}})

	for _, p := range []*v1.Pod{p1, p2} {
		if err := e.mount(p, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.drv.Calls("NodeStageVolume"); got != 2 {
		t.Errorf("NodeStageVolume calls = %d, want 2 (once per volume)", got)
	}
	if got := e.drv.Calls("NodePublishVolume"); got != 3 {
		t.Errorf("NodePublishVolume calls = %d, want 3", got)
	}
	mounted := e.vm.GetMountedVolumesForPod(p2.UID)
	if len(mounted) != 2 || mounted[0].SpecName != "data" || !mounted[0].ReadOnly || mounted[1].SpecName != "mine" {
		t.Fatalf("mounted volumes of p2 = %+v", mounted)
	}
	// The kubelet names a PVC's directory after the PV.
	want := filepath.Join(e.root, "pods", string(p2.UID), "volumes", "kubernetes.io~csi", ownPV, "mount")
	if mounted[1].Path != want {
		t.Errorf("path = %s, want %s", mounted[1].Path, want)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(want), "vol_data.json")); err != nil {
		t.Errorf("vol_data.json: %v", err)
	}
	if got := knownVolumes(e.vm); len(got) != 2 || got[0] != podvol.CSIVolumeName(e.drv.DriverName(), "handle-own") {
		t.Errorf("volumes in use = %v", got)
	}

	// p1 goes: the shared volume stays staged for p2.
	e.unmount(p1)
	if _, staged := e.drv.StagedVolumes()["handle-shared"]; !staged {
		t.Fatal("shared volume unstaged while p2 still uses it")
	}
	if e.vm.HasPossiblyMountedVolumesForPod(p1.UID) {
		t.Fatal("p1 still has volumes")
	}
	e.unmount(p2)
	waitUnstaged(t, e.vm)
	if got := e.drv.StagedVolumes(); len(got) != 0 {
		t.Errorf("still staged after WaitForUnstaged: %v", got)
	}
	if got := knownVolumes(e.vm); len(got) != 0 {
		t.Errorf("still in use after WaitForUnstaged: %v", got)
	}
	if got := e.drv.Calls("NodeUnpublishVolume"); got != 3 {
		t.Errorf("NodeUnpublishVolume calls = %d, want 3", got)
	}
	for _, p := range []*v1.Pod{p1, p2} {
		dir := filepath.Join(e.root, "pods", string(p.UID), "volumes", "kubernetes.io~csi")
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Errorf("left behind in %s: %v", dir, entries)
		}
	}
	if got := e.drv.Connections(); got != 1 {
		t.Errorf("driver connections = %d, want 1", got)
	}
}

func TestAttachRequired(t *testing.T) {
	// Required from the start: an update could reach the informer after
	// the pod is planned, and the volume would mount unattached.
	e := newEnv(t, envOptions{attachRequired: true})
	pvName := e.claim("vol")
	vaName := csiplugin.AttachmentName("handle-vol", e.drv.DriverName(), node)
	va := csitest.VolumeAttachment(vaName, e.drv.DriverName(), "pv-vol", node, false)
	va.Status.AttachError = &storagev1.VolumeError{Message: "disk is on fire"}
	e.create(va)
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "vol"}}})

	err := e.mount(pod, 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "disk is on fire") || !strings.Contains(err.Error(), "data") {
		t.Fatalf("WaitForAttachAndMount = %v, want the attach error naming the volume", err)
	}
	if e.drv.Calls("NodeStageVolume") != 0 {
		t.Fatal("staged a volume that is not attached")
	}
	// The attacher succeeds: the update alone (no backoff wait) mounts the volume.
	va.Status = storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: map[string]string{"dev": "/dev/x"}}
	if _, err := e.client.StorageV1().VolumeAttachments().UpdateStatus(context.Background(), va, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.mount(pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, r := range e.drv.Requests() {
		if r.Method == "NodeStageVolume" || r.Method == "NodePublishVolume" {
			if pc := r.Req.(interface{ GetPublishContext() map[string]string }).GetPublishContext(); pc["dev"] != "/dev/x" {
				t.Errorf("%s publish context = %v", r.Method, pc)
			}
		}
	}
	select {
	case ev := <-e.events.Events:
		// The kubelet waits for the attachment in its mount operation:
		// FailedMount, with the attacher's message alone.
		if want := `Warning FailedMount MountVolume.WaitForAttach failed for volume "` + pvName + `" : disk is on fire`; ev != want {
			t.Errorf("event %q\nwant  %q", ev, want)
		}
	default:
		t.Error("no event recorded for the attach error")
	}
}

func TestDriverRegisteredLater(t *testing.T) {
	e := newEnv(t, envOptions{noRegister: true})
	e.claim("vol")
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "vol"}}})
	err := e.mount(pod, 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "not found in the list of registered CSI drivers") {
		t.Fatalf("WaitForAttachAndMount = %v", err)
	}
	e.register() // retried at once, not after a backoff
	if err := e.mount(pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestFinalErrorRetried(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.claim("vol")
	e.drv.Inject(csitest.Fault{Method: "NodePublishVolume", Err: status.Error(codes.Internal, "no luck"), Times: 1})
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "vol"}}})
	if err := e.mount(pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := e.drv.Calls("NodePublishVolume"); got != 2 {
		t.Fatalf("NodePublishVolume calls = %d, want 2 (failed once, retried after backoff)", got)
	}
}

func TestFinalErrorReported(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.claim("vol")
	e.drv.Inject(csitest.Fault{Method: "NodePublishVolume", Err: status.Error(codes.InvalidArgument, "bad flags")})
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "vol"}}})
	err := e.mount(pod, 400*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "bad flags") || !strings.Contains(err.Error(), "unmounted volumes=[data]") {
		t.Fatalf("WaitForAttachAndMount = %v", err)
	}
	if e.vm.HasPossiblyMountedVolumesForPod(pod.UID) {
		t.Fatal("a final error left the volume possibly mounted")
	}
}

func TestTimeoutLeavesUncertainAndIsTornDown(t *testing.T) {
	e := newEnv(t, envOptions{callTimeout: 100 * time.Millisecond})
	e.claim("vol")
	block := make(chan struct{})
	defer close(block)
	e.drv.Inject(csitest.Fault{Method: "NodeStageVolume", Block: block})
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "vol"}}})
	e.vm.AddPod(pod)
	name := podvol.CSIVolumeName(e.drv.DriverName(), "handle-vol")
	eventually(t, "device uncertain", func() bool {
		v, ok := e.vm.asw.Volume(name)
		return ok && v.DeviceState == podvol.Uncertain
	})
	// The pod goes before the stage ever finished: the volume must still be unstaged.
	e.vm.DeletePod(pod)
	eventually(t, "NodeUnstageVolume of the uncertain device", func() bool { return e.drv.Calls("NodeUnstageVolume") > 0 })
	eventually(t, "volume forgotten", func() bool { _, ok := e.vm.asw.Volume(name); return !ok })
}

func TestUncertainStageRetried(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.claim("vol")
	e.drv.Inject(csitest.Fault{Method: "NodeStageVolume", Err: status.Error(codes.Unavailable, "busy"), Times: 1})
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "vol"}}})
	if err := e.mount(pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := e.drv.Calls("NodeStageVolume"); got != 2 {
		t.Fatalf("NodeStageVolume calls = %d, want 2", got)
	}
}

func TestBadInput(t *testing.T) {
	e := newEnv(t, envOptions{clusterInformers: true}) // the pending claim's binding seen at once (the object cache reads it again after ResyncPeriod)
	pending := csitest.PVC("ns", "pending", "")
	noCSI := csitest.PV("pv-iscsi", csitest.PVSpec{Driver: e.drv.DriverName(), Handle: "h"})
	noCSI.Spec.CSI = nil
	noCSI.Spec.ISCSI = &v1.ISCSIPersistentVolumeSource{TargetPortal: "10.0.0.1:3260", IQN: "iqn.2001-04.com.example:t"}
	iscsiClaim := csitest.PVC("ns", "iscsi", "pv-iscsi")
	noCSI.Spec.ClaimRef = &v1.ObjectReference{Namespace: "ns", Name: "iscsi", UID: iscsiClaim.UID}
	e.create(pending, noCSI, iscsiClaim)
	e.claimWith("secret", csitest.PVSpec{NodePublishSecret: &v1.SecretReference{Namespace: "ns", Name: "missing"}})

	tests := []struct {
		name string
		pod  *v1.Pod
		want string
	}{
		{"pending PVC", csitest.Pod("ns", "a", csitest.PodSpec{Volumes: []csitest.PodVolume{
			{Name: "data", Claim: "pending"},
		}}), "PVC ns/pending is not bound"},
		{"missing PVC", csitest.Pod("ns", "b", csitest.PodSpec{Volumes: []csitest.PodVolume{
			{Name: "data", Claim: "nope"},
		}}), "PVC ns/nope not found"},
		{"PV without CSI", csitest.Pod("ns", "c", csitest.PodSpec{Volumes: []csitest.PodVolume{
			{Name: "data", Claim: "iscsi"},
		}}), "of kind iscsi: no volume plugin handles it"},
		{"missing secret", csitest.Pod("ns", "d", csitest.PodSpec{Volumes: []csitest.PodVolume{
			{Name: "data", Claim: "secret"},
		}}), "missing"},
		{"unknown driver", csitest.Pod("ns", "e", csitest.PodSpec{Volumes: []csitest.PodVolume{
			{Name: "data", Claim: "nobody"},
		}}), "nobody.example.com not found"},
		{"hostile pod UID", csitest.Pod("ns", "f", csitest.PodSpec{UID: "../../../escape", Volumes: []csitest.PodVolume{
			{Name: "data", Claim: "secret"},
		}}), "pod UID"},
		{"block PV in volumeMounts", csitest.Pod("ns", "g", csitest.PodSpec{Volumes: []csitest.PodVolume{
			{Name: "data", Claim: "blk"},
		}}), "but is specified in volumeMounts"},
	}
	e.claimWith("blk", csitest.PVSpec{Block: true})
	pvc, pv := csitest.BoundClaim("ns", "nobody", csitest.PVSpec{Driver: "nobody.example.com", Handle: "h-nobody"})
	e.create(pvc, pv)
	if _, err := e.client.StorageV1().CSIDrivers().Create(context.Background(), csitest.CSIDriver("nobody.example.com", csitest.CSIDriverSpec{}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := e.mount(tc.pod, 300*time.Millisecond)
			// A PV nodevol cannot mount is final (ErrFinal) at once; the
			// others may resolve, and run out of time.
			ended := context.DeadlineExceeded
			if tc.name == "PV without CSI" {
				ended = ErrFinal
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ended) {
				t.Fatalf("WaitForAttachAndMount = %v, want %q, ending with %v", err, tc.want, ended)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(e.root, "..", "escape")); !os.IsNotExist(err) {
		t.Fatalf("a hostile pod UID created a path outside the root: %v", err)
	}
	// The pending claim binds: the waiting pod mounts without being added again.
	pvc, pv = csitest.BoundClaim("ns", "pending", csitest.PVSpec{Driver: e.drv.DriverName(), Handle: "handle-pending"})
	pvc.UID = pending.UID
	pv.Spec.ClaimRef.UID = pending.UID
	e.create(pv)
	if _, err := e.client.CoreV1().PersistentVolumeClaims("ns").Update(context.Background(), pvc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.vm.WaitForAttachAndMount(ctx, tests[0].pod); err != nil {
		t.Fatal(err)
	}
}

func TestInlineAndEphemeral(t *testing.T) {
	// Inline volumes are published without staging, which a driver that
	// stages refuses (the CSI spec makes staging_target_path required then).
	e := newEnv(t, envOptions{driver: csitest.Options{NoStageUnstage: true}})
	drv := csitest.CSIDriver(e.drv.DriverName(), csitest.CSIDriverSpec{LifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent, storagev1.VolumeLifecycleEphemeral}})
	if _, err := e.client.StorageV1().CSIDrivers().Update(context.Background(), drv, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{
		{Name: "scratch", Source: v1.VolumeSource{CSI: &v1.CSIVolumeSource{Driver: e.drv.DriverName(), VolumeAttributes: map[string]string{"size": "1Gi"}}}},
		{Name: "eph", Source: v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{VolumeClaimTemplate: &v1.PersistentVolumeClaimTemplate{Spec: v1.PersistentVolumeClaimSpec{
			AccessModes:      []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			StorageClassName: ptr.To("fast"),
			Resources:        v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")}},
		}}}}},
	}})
	pvc, pv := csitest.EphemeralClaim(pod, "eph", csitest.PVSpec{Driver: e.drv.DriverName(), Handle: "handle-eph"})
	e.create(pvc, pv)
	if err := e.mount(pod, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := e.drv.Calls("NodePublishVolume"); got != 2 {
		t.Errorf("NodePublishVolume calls = %d, want 2", got)
	}
	e.unmount(pod)
	eventually(t, "all unpublished", func() bool { return len(e.drv.PublishedVolumes()) == 0 && len(e.drv.StagedVolumes()) == 0 })
}

func TestNewValidates(t *testing.T) {
	if _, err := New(Config{KubeClient: fake.NewClientset()}); err == nil {
		t.Error("no NodeName accepted")
	}
	if _, err := New(Config{NodeName: node}); err == nil {
		t.Error("no KubeClient accepted")
	}
}

// TestPublishInFlightIsPossiblyMounted: while NodePublishVolume runs, the
// pod's directory must not be removed (HasPossiblyMountedVolumesForPod) and
// WaitForUnmount must not return; once the pod is deleted the publish is
// still undone.
func TestPublishInFlightIsPossiblyMounted(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.claim("vol")
	block := make(chan struct{})
	e.drv.Inject(csitest.Fault{Method: "NodePublishVolume", Block: block, Times: 1})
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "vol"}}})
	e.vm.AddPod(pod)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.drv.WaitForCalls(ctx, "NodePublishVolume", 1); err != nil {
		t.Fatal(err)
	}
	if !e.vm.HasPossiblyMountedVolumesForPod(pod.UID) {
		t.Fatal("a publish in flight is not counted as possibly mounted")
	}
	e.vm.DeletePod(pod)
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancelShort()
	if err := e.vm.WaitForUnmount(short, pod); err == nil {
		t.Fatal("WaitForUnmount returned while a publish was in flight")
	}
	close(block)
	if err := e.vm.WaitForUnmount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if got := e.drv.Calls("NodeUnpublishVolume"); got != 1 {
		t.Fatalf("NodeUnpublishVolume calls = %d, want 1: the publish that finished after the pod went must be undone", got)
	}
}

// TestWaitErrorNamesFailedList: with PVCs that cannot be listed
// (Config.ClusterInformers), the wait error says so, naming the list that
// fails, not a bare deadline.
func TestWaitErrorNamesFailedList(t *testing.T) {
	client := fake.NewClientset(csitest.CSIDriver("x.example.com", csitest.CSIDriverSpec{}))
	client.PrependReactor("list", "persistentvolumeclaims", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	vm, err := New(Config{NodeName: node, KubeClient: client, RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil), ClusterInformers: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- vm.Run(ctx) }()
	defer func() { cancel(); <-done }()
	pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{{Name: "data", Claim: "vol"}}})
	eventually(t, "the list error recorded", func() bool { return len(vm.listErrs.get()) > 0 })
	waitCtx, waitCancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer waitCancel()
	err = vm.WaitForAttachAndMount(waitCtx, pod)
	var we *WaitError
	if !errors.As(err, &we) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v (%T), want a *WaitError wrapping the deadline", err, err)
	}
	for _, want := range []string{`volume "data"`, "listing PersistentVolumeClaims failed", "connection refused"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "context deadline exceeded") {
		t.Errorf("error %q ends with a bare deadline although it has a cause", err)
	}
}

// TestWaitErrorText: each volume is explained once: by the operation
// running on it (with the last error, from an earlier attempt, beside
// it), else by its error, else by what it waits for; a bare deadline only
// when nothing explains any volume.
func TestWaitErrorText(t *testing.T) {
	cause := errors.New("PVC ns/nope not found")
	tests := []struct {
		name string
		we   WaitError
		want string
	}{
		{
			name: "cause once",
			we:   WaitError{Volumes: []string{"data", "logs"}, Causes: map[string]error{"data": cause}},
			want: `pod ns/web: unmounted volumes=[data logs]; volume "data": PVC ns/nope not found`,
		},
		{
			name: "nothing known",
			we:   WaitError{Volumes: []string{"data"}},
			want: "pod ns/web: unmounted volumes=[data]: context deadline exceeded with no error reported",
		},
		{
			name: "running",
			we:   WaitError{Volumes: []string{"data"}, Running: map[string]string{"data": "NodePublishVolume still running after 3s"}},
			want: `pod ns/web: unmounted volumes=[data]; volume "data": NodePublishVolume still running after 3s`,
		},
		{
			name: "running after an error",
			we: WaitError{Volumes: []string{"data"}, Causes: map[string]error{"data": errors.New("rpc error: code = Internal desc = no luck")},
				Running: map[string]string{"data": "NodePublishVolume still running after 3s"}},
			want: `pod ns/web: unmounted volumes=[data]; volume "data": NodePublishVolume still running after 3s (last error: rpc error: code = Internal desc = no luck)`,
		},
		{
			name: "running before waiting",
			we: WaitError{Volumes: []string{"data", "logs"}, Running: map[string]string{"logs": "NodeStageVolume still running after 1.5s"},
				Waiting: map[string]string{"data": "waiting for the informers", "logs": "waiting for the informers"}},
			want: `pod ns/web: unmounted volumes=[data logs]; volume "data": waiting for the informers; volume "logs": NodeStageVolume still running after 1.5s`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			we := tc.we
			we.Pod, we.What, we.Err = "ns/web", "unmounted volumes", context.DeadlineExceeded
			if got := we.Error(); got != tc.want {
				t.Fatalf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}
