package volumemanager

// Integration tests: a VolumeManager against a real kube-apiserver and etcd
// (package testenv), with the test kit's in-process CSI driver and the fake
// mounter. Every object the manager reads comes through the real API; pods
// are created there too and handed to the manager with AddPod, as a node
// agent's pod informer would. They skip (as testenv.StartT does) when the
// binaries are missing; make integration builds them.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/mount-utils"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/testenv"
)

// integNS is the namespace every integration test creates its objects in.
const integNS = "ns"

// integEnv is a real API server, an admin client of it, the test kit's
// driver and a root directory for the volume manager.
type integEnv struct {
	t     *testing.T
	api   *testenv.Env
	admin kubernetes.Interface
	drv   *csitest.Server
	root  string
}

// startInteg starts etcd and kube-apiserver with opts, creates the
// namespace integNS and the driver's CSIDriver (attachRequired as given),
// and starts the test kit's driver.
func startInteg(t *testing.T, opts testenv.Options, attachRequired bool) *integEnv {
	t.Helper()
	api := testenv.StartT(t, opts)
	e := &integEnv{
		t: t, api: api, admin: kubernetes.NewForConfigOrDie(api.Config()),
		drv: csitest.New(t, csitest.Options{CreateTargetDirs: true}), root: t.TempDir(),
	}
	ctx := t.Context()
	if _, err := e.admin.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: integNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	if _, err := e.admin.StorageV1().CSIDrivers().Create(ctx, csitest.CSIDriver(e.drv.DriverName(), csitest.CSIDriverSpec{AttachRequired: attachRequired}), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create CSIDriver: %v", err)
	}
	return e
}

// startVM runs a VolumeManager with cfg (NodeName, RootDir, Mounter and,
// when unset, KubeClient (the admin's) filled in), registers the driver
// with it and stops it when the test ends.
func (e *integEnv) startVM(cfg Config) *VolumeManager {
	e.t.Helper()
	cfg.NodeName, cfg.RootDir, cfg.Mounter = node, e.root, mount.NewFakeMounter(nil)
	if cfg.KubeClient == nil {
		cfg.KubeClient = e.admin
	}
	vm, err := New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- vm.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("Run: %v", err)
		}
	})
	if err := vm.Drivers().Register(ctx, e.drv.DriverName(), e.drv.Endpoint()); err != nil {
		e.t.Fatal(err)
	}
	return vm
}

// claim creates, through the API, a PVC and the CSI PV bound to it (volume
// handle "handle-"+name), both Bound as the PV controller leaves them, and
// returns the PV as stored.
func (e *integEnv) claim(name string) *v1.PersistentVolume {
	e.t.Helper()
	return e.claimWith(name, csitest.PVSpec{})
}

// claimWith is claim with a volume described by spec, whose driver and
// handle it sets.
func (e *integEnv) claimWith(name string, spec csitest.PVSpec) *v1.PersistentVolume {
	e.t.Helper()
	spec.Driver, spec.Handle = e.drv.DriverName(), "handle-"+name
	pvc, pv := csitest.BoundClaim(integNS, name, spec)
	_, pv, err := csitest.CreateBound(e.t.Context(), e.admin, pvc, pv)
	if err != nil {
		e.t.Fatal(err)
	}
	return pv
}

// pod creates a pod on node through the API and returns it as stored
// (with the server's UID).
func (e *integEnv) pod(name string, vols ...csitest.PodVolume) *v1.Pod {
	e.t.Helper()
	p := csitest.Pod(integNS, name, csitest.PodSpec{Node: node, Volumes: vols})
	created, err := e.admin.CoreV1().Pods(integNS).Create(e.t.Context(), p, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create pod %s: %v", name, err)
	}
	return created
}

// deletePod deletes the pod through the API with grace period 0 (no kubelet
// confirms a graceful delete here), then from the manager, and waits until
// its volumes are unmounted.
func (e *integEnv) deletePod(vm *VolumeManager, p *v1.Pod) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 30*time.Second)
	defer cancel()
	if err := e.admin.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		e.t.Fatalf("delete pod %s: %v", p.Name, err)
	}
	vm.DeletePod(p)
	if err := vm.WaitForUnmount(ctx, p); err != nil {
		e.t.Fatal(err)
	}
}

// mountPod adds the pod and waits (up to timeout) for its volumes.
func mountPod(ctx context.Context, vm *VolumeManager, p *v1.Pod, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	vm.AddPod(p)
	return vm.WaitForAttachAndMount(ctx, p)
}

// waitUntil polls cond (which may call the API) until it holds, bounded
// by timeout: for state in the API server, which has nothing to wait on.
func waitUntil(t *testing.T, what string, timeout time.Duration, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		ok, err := cond(ctx)
		if err != nil {
			last = err // the API may be briefly unavailable: try again
			return false, nil
		}
		return ok, nil
	})
	if err != nil {
		t.Fatalf("timed out after %v waiting for %s (last error: %v)", timeout, what, last)
	}
}

// TestIntegrationMountThroughAPI: PVCs, PVs, the CSIDriver, a Secret
// (the PV's nodePublishSecretRef) and pods created through the real API;
// the manager's informers see them, the pods mount (one claim shared by
// two pods: staged once, published twice), the driver gets the secret's
// data in NodePublishVolume, and the pods unmount when deleted.
func TestIntegrationMountThroughAPI(t *testing.T) {
	e := startInteg(t, testenv.Options{}, false)
	ctx := t.Context()
	secret := csitest.Secret(integNS, "publish-creds", map[string]string{"user": "alice", "password": "s3cret"})
	if _, err := e.admin.CoreV1().Secrets(integNS).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.claimWith("shared", csitest.PVSpec{
		AccessModes:       []v1.PersistentVolumeAccessMode{v1.ReadWriteMany},
		NodePublishSecret: &v1.SecretReference{Namespace: integNS, Name: "publish-creds"},
	})
	e.claim("own")
	vm := e.startVM(Config{})
	p1 := e.pod("p1", csitest.PodVolume{Name: "data", Claim: "shared"})
	p2 := e.pod("p2", csitest.PodVolume{Name: "data", Claim: "shared", ReadOnly: true}, csitest.PodVolume{Name: "mine", Claim: "own"})
	for _, p := range []*v1.Pod{p1, p2} {
		if err := mountPod(ctx, vm, p, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.drv.Calls("NodeStageVolume"); got != 2 {
		t.Errorf("NodeStageVolume calls = %d, want 2 (once per volume)", got)
	}
	if got := e.drv.Calls("NodePublishVolume"); got != 3 {
		t.Errorf("NodePublishVolume calls = %d, want 3", got)
	}
	withSecret := 0
	for _, r := range e.drv.Requests() {
		req, ok := r.Req.(*csi.NodePublishVolumeRequest)
		if !ok {
			continue
		}
		switch r.VolumeID {
		case "handle-shared":
			withSecret++
			if s := req.GetSecrets(); s["user"] != "alice" || s["password"] != "s3cret" || len(s) != 2 {
				t.Errorf("NodePublishVolume of handle-shared got secrets with keys %v, want the Secret's data (user, password)", slices.Sorted(mapsKeys(s)))
			}
		case "handle-own":
			if len(req.GetSecrets()) != 0 {
				t.Errorf("NodePublishVolume of handle-own got secrets, want none")
			}
		}
	}
	if withSecret != 2 {
		t.Errorf("NodePublishVolume of handle-shared called %d times, want 2", withSecret)
	}
	if m := vm.GetMountedVolumesForPod(p2.UID); len(m) != 2 {
		t.Errorf("mounted volumes of p2: %+v, want 2", m)
	}
	e.deletePod(vm, p1)
	if _, staged := e.drv.StagedVolumes()["handle-shared"]; !staged {
		t.Fatal("the shared volume was unstaged while p2 still uses it")
	}
	e.deletePod(vm, p2)
	waitUnstaged(t, vm)
	if s, p, u := e.drv.StagedVolumes(), e.drv.PublishedVolumes(), knownVolumes(vm); len(s)+len(p)+len(u) != 0 {
		t.Errorf("after WaitForUnstaged: staged %v, published %v, in use %v; want none", s, p, u)
	}
	if got := e.drv.Calls("NodeUnpublishVolume"); got != 3 {
		t.Errorf("NodeUnpublishVolume calls = %d, want 3", got)
	}
}

func mapsKeys(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// TestIntegrationAttachRequired: the CSIDriver says attachRequired; the
// test plays the attach/detach controller (it creates the
// VolumeAttachments) and runs the fake external-attacher against the real
// API, with a fake clock that holds the attachment until the test steps
// it. nodevol does not stage before status.attached: no NodeStageVolume
// while the attacher waits, and the NodeStageVolume that comes carries the
// attachment metadata and arrives after the status was written. An attach
// error the attacher sets in the status surfaces in WaitForAttachAndMount's
// error.
func TestIntegrationAttachRequired(t *testing.T) {
	e := startInteg(t, testenv.Options{}, true)
	ctx := t.Context()
	good := e.claim("good")
	bad := e.claim("bad")
	clk := testingclock.NewFakeClock(time.Now())
	attacherCtx, stopAttacher := context.WithCancel(ctx)
	attacherDone := make(chan error, 1)
	go func() {
		attacherDone <- csitest.RunFakeAttacher(attacherCtx, e.admin, csitest.AttacherOptions{
			Delay: time.Hour, Clock: clk, Metadata: map[string]string{"devicePath": "/dev/fake0"},
			Fail: map[string]string{bad.Name: "disk is on fire"},
		})
	}()
	t.Cleanup(func() { stopAttacher(); <-attacherDone })
	for _, pv := range []*v1.PersistentVolume{good, bad} {
		if _, err := csitest.AttachVolume(ctx, e.admin, pv, node); err != nil {
			t.Fatal(err)
		}
	}
	vm := e.startVM(Config{})
	pGood := e.pod("good", csitest.PodVolume{Name: "data", Claim: "good"})
	pBad := e.pod("bad", csitest.PodVolume{Name: "data", Claim: "bad"})
	vm.AddPod(pGood)
	vm.AddPod(pBad)

	// The attacher has seen both attachments and waits on its clock; the
	// manager waits for the attachment: nothing is staged.
	eventually(t, "the attacher waiting on both VolumeAttachments", func() bool { return clk.Waiters() == 2 })
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	err := vm.WaitForAttachAndMount(short, pGood)
	cancel()
	if err == nil {
		t.Fatal("mounted before the VolumeAttachment said attached")
	}
	if n := e.drv.Calls("NodeStageVolume"); n != 0 {
		t.Fatalf("NodeStageVolume called %d times before status.attached", n)
	}
	attachedAt := time.Now()
	clk.Step(time.Hour)
	if err := mountPod(ctx, vm, pGood, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, r := range e.drv.Requests() {
		if r.Method != "NodeStageVolume" {
			continue
		}
		if r.Time.Before(attachedAt) {
			t.Errorf("NodeStageVolume of %s at %v, before the attacher was let go (%v)", r.VolumeID, r.Time, attachedAt)
		}
		if r.VolumeID == "handle-bad" {
			t.Errorf("NodeStageVolume of handle-bad, whose attachment failed")
		}
		if pc := r.Req.(*csi.NodeStageVolumeRequest).GetPublishContext(); pc["devicePath"] != "/dev/fake0" {
			t.Errorf("NodeStageVolume publish context %v, want the attachment metadata", pc)
		}
	}
	var last error
	waitUntil(t, "the attach error in WaitForAttachAndMount's error", 30*time.Second, func(ctx context.Context) (bool, error) {
		ctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		last = vm.WaitForAttachAndMount(ctx, pBad)
		return last != nil && strings.Contains(last.Error(), "disk is on fire"), nil
	})
	var we *WaitError
	if !errors.As(last, &we) || !strings.Contains(last.Error(), `volume "data"`) {
		t.Errorf("WaitForAttachAndMount(bad) = %v, want a *WaitError naming volume \"data\"", last)
	}
	t.Logf("attach error as reported: %v", last)
	e.deletePod(vm, pGood)
	e.deletePod(vm, pBad)
}

// TestIntegrationAPIServerDown: kube-apiserver stops while a pod is
// mounted (Config.ClusterInformers). Pods are added while it is down: one whose claim the informers
// already hold, one whose claim is created only once the server is back.
// Nothing mounted is torn down meanwhile (no NodeUnpublishVolume or
// NodeUnstageVolume); once the server is back the informers recover and
// both new pods mount.
func TestIntegrationAPIServerDown(t *testing.T) {
	e := startInteg(t, testenv.Options{}, false)
	ctx := t.Context()
	e.claim("before")
	e.claim("known")
	// Resyncs during the outage; p3's claim is created only after it,
	// later than the default ClaimPendingGracePeriod.
	vm := e.startVM(Config{ResyncPeriod: 500 * time.Millisecond, ClaimPendingGracePeriod: time.Hour, ClusterInformers: true})
	p1 := e.pod("p1", csitest.PodVolume{Name: "data", Claim: "before"})
	if err := mountPod(ctx, vm, p1, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	// Built here, not created: the API is about to go.
	p2 := csitest.Pod(integNS, "p2", csitest.PodSpec{Node: node, Volumes: []csitest.PodVolume{{Name: "data", Claim: "known"}}})
	p3 := csitest.Pod(integNS, "p3", csitest.PodSpec{Node: node, Volumes: []csitest.PodVolume{{Name: "data", Claim: "later"}}})

	e.api.StopAPIServer()
	down := time.Now()
	vm.AddPod(p2)
	vm.AddPod(p3)
	// While down: p3's claim cannot be found, and the client sees the
	// server gone (the informers' watches end and relists fail).
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	err := vm.WaitForAttachAndMount(short, p3)
	cancel()
	if err == nil || !strings.Contains(err.Error(), "PVC ns/later not found") {
		t.Errorf("WaitForAttachAndMount(p3) while the API is down = %v, want it to say the claim is not found", err)
	}
	if _, err := e.admin.CoreV1().Namespaces().Get(ctx, integNS, metav1.GetOptions{}); err == nil {
		t.Fatal("the API answered while stopped")
	}
	if err := e.api.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("API server down for %v", time.Since(down).Round(time.Millisecond))
	back := time.Now()
	e.claim("later")
	for _, p := range []*v1.Pod{p1, p2, p3} {
		if err := mountPod(ctx, vm, p, 60*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("p2 and p3 mounted %v after the API server was back", time.Since(back).Round(time.Millisecond))
	if n := e.drv.Calls("NodeUnpublishVolume") + e.drv.Calls("NodeUnstageVolume"); n != 0 {
		t.Errorf("%d NodeUnpublishVolume/NodeUnstageVolume calls across the outage, want 0", n)
	}
	if n := e.drv.Calls("NodePublishVolume"); n != 3 {
		t.Errorf("NodePublishVolume calls = %d, want 3 (p1's volume published once)", n)
	}
	for _, p := range []*v1.Pod{p1, p2, p3} {
		vm.DeletePod(p)
		waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := vm.WaitForUnmount(waitCtx, p)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	waitUnstaged(t, vm)
	if got := e.drv.StagedVolumes(); len(got) != 0 {
		t.Errorf("still staged after WaitForUnstaged: %v", got)
	}
}

// TestIntegrationEventsAndVolumesInUse: with an EventRecorder built from a
// real broadcaster writing to the API, a pod whose driver fails
// NodePublishVolume gets a FailedMount event, readable through the API,
// that carries the driver's message; with ReportVolumesInUse and a Node
// created through the API, the Node's status.volumesInUse lists the
// mounted volume (its driver needs attaching: only such volumes are
// listed), and no longer once its pod is gone.
func TestIntegrationEventsAndVolumesInUse(t *testing.T) {
	e := startInteg(t, testenv.Options{}, true)
	ctx := t.Context()
	attacherCtx, stopAttacher := context.WithCancel(ctx)
	attacherDone := make(chan error, 1)
	go func() { attacherDone <- csitest.RunFakeAttacher(attacherCtx, e.admin, csitest.AttacherOptions{}) }()
	t.Cleanup(func() { stopAttacher(); <-attacherDone })
	if _, err := e.admin.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: e.admin.CoreV1().Events("")})
	t.Cleanup(broadcaster.Shutdown)
	recorder := broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: "nodevol-test", Host: node})
	okPV, broken := e.claim("ok"), e.claim("broken")
	brokenPV := broken.Name
	for _, pv := range []*v1.PersistentVolume{okPV, broken} { // the attach/detach controller's part
		if _, err := csitest.AttachVolume(ctx, e.admin, pv, node); err != nil {
			t.Fatal(err)
		}
	}
	e.drv.Inject(csitest.Fault{Method: "NodePublishVolume", VolumeID: "handle-broken", Err: status.Error(codes.InvalidArgument, "mount option nosuchoption is not supported")})
	vm := e.startVM(Config{EventRecorder: recorder, ReportVolumesInUse: true})

	good := e.pod("good", csitest.PodVolume{Name: "data", Claim: "ok"})
	if err := mountPod(ctx, vm, good, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	okName := v1.UniqueVolumeName(podvol.CSIVolumeName(e.drv.DriverName(), "handle-ok"))
	brokenName := v1.UniqueVolumeName(podvol.CSIVolumeName(e.drv.DriverName(), "handle-broken"))
	inUse := func(ctx context.Context) ([]v1.UniqueVolumeName, error) {
		n, err := e.admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		return n.Status.VolumesInUse, nil
	}
	got, err := inUse(ctx)
	if err != nil || !slices.Contains(got, okName) {
		// A volume is in use from its stage on, reported before the pod
		// counts as mounted only for volumes that need attaching: here
		// the report may lag the mount.
		waitUntil(t, "the Node's volumesInUse to list "+string(okName), 30*time.Second, func(ctx context.Context) (bool, error) {
			got, err := inUse(ctx)
			return slices.Contains(got, okName), err
		})
	}

	bad := e.pod("bad", csitest.PodVolume{Name: "data", Claim: "broken"})
	vm.AddPod(bad)
	var events []v1.Event
	waitUntil(t, "a FailedMount event on pod bad", 30*time.Second, func(ctx context.Context) (bool, error) {
		list, err := e.admin.CoreV1().Events(integNS).List(ctx, metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.uid": string(bad.UID), "reason": "FailedMount"}.String(),
		})
		if err != nil {
			return false, err
		}
		events = list.Items
		return len(events) > 0, nil
	})
	ev := events[0]
	want := fmt.Sprintf(`MountVolume.SetUp failed for volume %q : rpc error: code = InvalidArgument desc = mount option nosuchoption is not supported`, brokenPV)
	if ev.Type != v1.EventTypeWarning || ev.InvolvedObject.Name != "bad" || ev.InvolvedObject.Kind != "Pod" ||
		ev.Message != want || ev.Source.Component != "nodevol-test" {
		t.Errorf("event %s/%s: type %s, object %s %s, source %v, message %q; want a Warning on pod bad with the kubelet's words: %q",
			ev.Namespace, ev.Name, ev.Type, ev.InvolvedObject.Kind, ev.InvolvedObject.Name, ev.Source, ev.Message, want)
	}
	// The broken volume was staged (only its publish fails): in use too.
	waitUntil(t, "both volumes in the Node's volumesInUse", 30*time.Second, func(ctx context.Context) (bool, error) {
		got, err := inUse(ctx)
		return slices.Contains(got, okName) && slices.Contains(got, brokenName), err
	})
	e.drv.ClearFaults()
	e.deletePod(vm, good)
	e.deletePod(vm, bad)
	waitUntil(t, "the Node's volumesInUse to be empty", 30*time.Second, func(ctx context.Context) (bool, error) {
		got, err := inUse(ctx)
		return len(got) == 0, err
	})
	if list, err := e.admin.CoreV1().Events(integNS).List(ctx, metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.uid": string(good.UID)}.String(),
	}); err != nil || len(list.Items) != 0 {
		t.Errorf("events on pod good: %v, %v; want none", list, err)
	}
}

// TestIntegrationBadAPIAnswers: what the real API refuses is reported
// clearly and not retried in a hot loop.
//
//   - Node missing: with ReportVolumesInUse, a volume that needs
//     attaching is confirmed attached only once reported in the Node's
//     status.volumesInUse, which fails while there is no Node: the wait
//     error says so, the patches back off, and once the Node is created
//     the pod mounts.
//   - A read-only token (RBAC: get/list/watch, nothing else): the informers
//     work, the report is forbidden, and the wait error names the verb
//     and resource (patch, nodes/status).
func TestIntegrationBadAPIAnswers(t *testing.T) {
	const reader = "reader"
	e := startInteg(t, testenv.Options{Users: []testenv.User{{Name: reader}}}, true)
	ctx := t.Context()
	pv := e.claim("vol")
	if _, err := csitest.AttachVolume(ctx, e.admin, pv, node); err != nil {
		t.Fatal(err)
	}
	attacher, stopAttacher := context.WithCancel(ctx)
	attacherDone := make(chan error, 1)
	go func() { attacherDone <- csitest.RunFakeAttacher(attacher, e.admin, csitest.AttacherOptions{}) }()
	t.Cleanup(func() { stopAttacher(); <-attacherDone })

	t.Run("node missing", func(t *testing.T) {
		var requests requestCounter
		client := kubernetes.NewForConfigOrDie(requests.wrap(e.api.Config()))
		vm := e.startVM(Config{KubeClient: client, ReportVolumesInUse: true})
		pod := e.pod("p", csitest.PodVolume{Name: "data", Claim: "vol"})
		start := time.Now()
		err := mountPod(ctx, vm, pod, 3*time.Second)
		elapsed := time.Since(start)
		for _, want := range []string{`volume "data"`, "volumesInUse", `nodes "node-1" not found`} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("WaitForAttachAndMount = %v; want it to say %q", err, want)
			}
		}
		patches := requests.get("PATCH nodes/status")
		// Backoff from 500 ms, doubling: 0, 0.5, 1.5, 3.5 s...
		if max := 2 + int(elapsed/(500*time.Millisecond)); patches == 0 || patches > max {
			t.Errorf("%d Node status patches in %v, want 1..%d (backoff, no hot loop)", patches, elapsed.Round(time.Millisecond), max)
		}
		t.Logf("%d Node status patches in %v; error: %v", patches, elapsed.Round(time.Millisecond), err)
		if _, err := e.admin.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := mountPod(ctx, vm, pod, 60*time.Second); err != nil {
			t.Fatal(err)
		}
		e.deletePod(vm, pod)
	})

	t.Run("read-only token", func(t *testing.T) {
		readOnly := &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: "read-only"},
			Rules: []rbacv1.PolicyRule{{
				Verbs:     []string{"get", "list", "watch"},
				APIGroups: []string{"", "storage.k8s.io"},
				Resources: []string{"persistentvolumeclaims", "persistentvolumes", "nodes", "secrets", "csidrivers", "volumeattachments"},
			}},
		}
		binding := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "read-only"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: readOnly.Name},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: reader}},
		}
		if _, err := e.admin.RbacV1().ClusterRoles().Create(ctx, readOnly, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		cfg, err := e.api.TokenConfig(reader)
		if err != nil {
			t.Fatal(err)
		}
		var requests requestCounter
		client := kubernetes.NewForConfigOrDie(requests.wrap(cfg))
		// RBAC may take a moment to see the new binding.
		waitUntil(t, "the reader allowed to list PVCs", 30*time.Second, func(ctx context.Context) (bool, error) {
			_, err := client.CoreV1().PersistentVolumeClaims(integNS).List(ctx, metav1.ListOptions{})
			return err == nil, err
		})
		e.root = t.TempDir() // a fresh node root for the second manager
		vm := e.startVM(Config{KubeClient: client, ReportVolumesInUse: true})
		pod := e.pod("q", csitest.PodVolume{Name: "data", Claim: "vol"})
		start := time.Now()
		err = mountPod(ctx, vm, pod, 3*time.Second)
		elapsed := time.Since(start)
		for _, want := range []string{`volume "data"`, `cannot patch resource "nodes/status"`, `User "reader"`} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("WaitForAttachAndMount = %v; want it to say %q", err, want)
			}
		}
		patches := requests.get("PATCH nodes/status")
		if max := 2 + int(elapsed/(500*time.Millisecond)); patches == 0 || patches > max {
			t.Errorf("%d Node status patches in %v, want 1..%d (backoff, no hot loop)", patches, elapsed.Round(time.Millisecond), max)
		}
		t.Logf("%d Node status patches in %v; error: %v", patches, elapsed.Round(time.Millisecond), err)
		if n := e.drv.Calls("NodeStageVolume"); n != 1 {
			t.Errorf("NodeStageVolume calls = %d, want 1 (the first subtest's only)", n)
		}
		vm.DeletePod(pod)
		waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := vm.WaitForUnmount(waitCtx, pod); err != nil {
			t.Fatal(err)
		}
	})
}
