package csiplugin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/mount-utils"

	"github.com/google/go-cmp/cmp"

	"github.com/nodevol/nodevol/csi"
	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

const drv = csitest.DefaultDriverName

// env is a plugin wired to an in-process CSI driver over a real unix
// socket, the fake clientset (listers through a synced informer factory)
// and the fake mounter.
type env struct {
	root    string
	srv     *csitest.Server
	reg     *csi.Registry
	p       *plugin
	mounter *mount.FakeMounter
}

type envOptions struct {
	driver      csitest.Options
	objects     []runtime.Object
	callTimeout time.Duration
}

func newEnv(t *testing.T, o envOptions) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	client := fake.NewClientset(o.objects...)
	factory := informers.NewSharedInformerFactory(client, 0)
	csiDrivers := factory.Storage().V1().CSIDrivers()
	attachments := factory.Storage().V1().VolumeAttachments()
	csiDrivers.Informer()
	attachments.Informer()
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	t.Cleanup(func() { cancel(); factory.Shutdown() })

	e := &env{root: filepath.Join(t.TempDir(), "kubelet"), srv: csitest.New(t, o.driver), mounter: mount.NewFakeMounter(nil)}
	e.reg = csi.NewRegistry(csi.RegistryOptions{})
	t.Cleanup(func() { _ = e.reg.Close() })
	if err := e.reg.Register(ctx, e.srv.DriverName(), e.srv.Endpoint()); err != nil {
		t.Fatalf("Register: %v", err)
	}
	var err error
	e.p, err = newPlugin(Config{
		RootDir: e.root, NodeName: testNode, Registry: e.reg,
		CSIDriverLister: csiDrivers.Lister(), VolumeAttachmentLister: attachments.Lister(),
		Mounter: e.mounter, CallTimeout: o.callTimeout,
	})
	if err != nil {
		t.Fatal(err)
	}
	e.p.secrets = newSecretGetter(client) // the Secrets, with no KubeClient (no self-attach)
	return e
}

// request returns the last request of method the driver received.
func (e *env) request(t *testing.T, method string) proto.Message {
	t.Helper()
	reqs := e.srv.Requests()
	for i := len(reqs) - 1; i >= 0; i-- {
		if reqs[i].Method == method {
			return reqs[i].Req
		}
	}
	t.Fatalf("the driver received no %s", method)
	return nil
}

func podVolume(uid, specName string) podvol.PodVolume {
	return podvol.PodVolume{
		Pod:      podvol.PodRef{UID: types.UID("uid-" + uid), Namespace: "ns", Name: "pod-" + uid, ServiceAccount: "sa"},
		SpecName: specName,
	}
}

func volData(t *testing.T, dir string) ondisk.VolumeData {
	t.Helper()
	d, err := ondisk.LoadVolumeData(dir)
	if err != nil {
		t.Fatal(err)
	}
	return *d
}

func assertGone(t *testing.T, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still exists (%v)", p, err)
		}
	}
}

func TestStageAndPublish(t *testing.T) {
	e := newEnv(t, envOptions{
		driver: csitest.Options{CreateTargetDirs: true},
		objects: []runtime.Object{
			csitest.Secret("secrets", "stage", map[string]string{"user": "admin"}),
			csitest.Secret("secrets", "publish", map[string]string{"token": "t0k"}),
		},
	})
	spec := testSpec(drv)
	spec.MountOptions = []string{"noatime", "discard"}
	spec.Attributes = map[string]string{"pool": "fast"}
	spec.NodeStageSecret = &podvol.SecretRef{Namespace: "secrets", Name: "stage"}
	spec.NodePublishSecret = &podvol.SecretRef{Namespace: "secrets", Name: "publish"}
	pc := map[string]string{"devicePath": "/dev/xvdb"}
	ctx := context.Background()

	stagingPath, err := e.p.MountDevice(ctx, volume.DeviceRequest{Spec: spec, PublishContext: pc})
	if err != nil {
		t.Fatalf("MountDevice: %v", err)
	}
	stagingDir := filepath.Join(e.root, "plugins/kubernetes.io/csi", drv, sha256Hex("vol-1"))
	if want := filepath.Join(stagingDir, "globalmount"); stagingPath != want {
		t.Errorf("staging path = %s, want %s", stagingPath, want)
	}
	if st, err := os.Stat(stagingPath); err != nil || !st.IsDir() {
		t.Errorf("staging path is not a directory: %v", err)
	}
	if got, want := volData(t, stagingDir), (ondisk.VolumeData{SpecVolID: "pv-1", VolumeHandle: "vol-1", DriverName: drv}); got != want {
		t.Errorf("staging vol_data.json = %+v, want %+v", got, want)
	}
	mountCap := &csipb.VolumeCapability{
		AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: "ext4", MountFlags: []string{"noatime", "discard"}}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	wantStage := &csipb.NodeStageVolumeRequest{
		VolumeId: "vol-1", PublishContext: pc, StagingTargetPath: stagingPath, VolumeCapability: mountCap,
		Secrets: map[string]string{"user": "admin"}, VolumeContext: map[string]string{"pool": "fast"},
	}
	if diff := cmp.Diff(wantStage, e.request(t, "NodeStageVolume"), protocmp.Transform()); diff != "" {
		t.Errorf("NodeStageVolume request (-want +got):\n%s", diff)
	}

	vol := podVolume("a", "data")
	vol.ReadOnly = true
	target, err := e.p.SetUp(ctx, volume.MountRequest{Spec: spec, Volume: vol, PublishContext: pc, DeviceMountPath: stagingPath})
	if err != nil {
		t.Fatalf("SetUp: %v", err)
	}
	// As in the kubelet, a PV's pod directory is named after the PV.
	volDir := filepath.Join(e.root, "pods", string(vol.Pod.UID), "volumes/kubernetes.io~csi/pv-1")
	if want := filepath.Join(volDir, "mount"); target != want {
		t.Errorf("target path = %s, want %s", target, want)
	}
	wantData := ondisk.VolumeData{SpecVolID: "pv-1", VolumeHandle: "vol-1", DriverName: drv, NodeName: testNode,
		AttachmentID: AttachmentName("vol-1", drv, testNode), VolumeLifecycleMode: "Persistent"}
	if got := volData(t, volDir); got != wantData {
		t.Errorf("pod vol_data.json = %+v, want %+v", got, wantData)
	}
	wantPublish := &csipb.NodePublishVolumeRequest{
		VolumeId: "vol-1", PublishContext: pc, StagingTargetPath: stagingPath, TargetPath: target,
		VolumeCapability: mountCap, Readonly: true,
		Secrets: map[string]string{"token": "t0k"}, VolumeContext: map[string]string{"pool": "fast"},
	}
	if diff := cmp.Diff(wantPublish, e.request(t, "NodePublishVolume"), protocmp.Transform()); diff != "" {
		t.Errorf("NodePublishVolume request (-want +got):\n%s", diff)
	}
	if got := e.srv.PublishedVolumes()["vol-1"]; len(got) != 1 || got[0] != target {
		t.Errorf("driver has the volume published at %v", got)
	}

	// Idempotent: the same calls again succeed.
	if _, err := e.p.MountDevice(ctx, volume.DeviceRequest{Spec: spec, PublishContext: pc}); err != nil {
		t.Errorf("MountDevice again: %v", err)
	}
	if _, err := e.p.SetUp(ctx, volume.MountRequest{Spec: spec, Volume: vol, PublishContext: pc, DeviceMountPath: stagingPath}); err != nil {
		t.Errorf("SetUp again: %v", err)
	}

	if err := e.p.TearDown(ctx, volume.MountRequest{Spec: spec, Volume: vol}); err != nil {
		t.Fatalf("TearDown: %v", err)
	}
	assertGone(t, volDir)
	if err := e.p.UnmountDevice(ctx, volume.DeviceRequest{Spec: spec}); err != nil {
		t.Fatalf("UnmountDevice: %v", err)
	}
	assertGone(t, stagingDir)
	if _, staged := e.srv.StagedVolumes()["vol-1"]; staged {
		t.Error("volume still staged")
	}
	unstage := e.request(t, "NodeUnstageVolume").(*csipb.NodeUnstageVolumeRequest)
	if unstage.GetVolumeId() != "vol-1" || unstage.GetStagingTargetPath() != stagingPath {
		t.Errorf("NodeUnstageVolume request = %v", unstage)
	}

	// Idempotent: tearing down again does nothing and calls nothing.
	e.srv.Reset()
	if err := e.p.TearDown(ctx, volume.MountRequest{Spec: spec, Volume: vol}); err != nil {
		t.Errorf("TearDown again: %v", err)
	}
	if err := e.p.UnmountDevice(ctx, volume.DeviceRequest{Spec: spec}); err != nil {
		t.Errorf("UnmountDevice again: %v", err)
	}
	if n := e.srv.Calls(""); n != 0 {
		t.Errorf("tearing down again made %d calls", n)
	}
}

// sha256Hex is how the kubelet's layout names a staging directory after
// its volume handle, spelled out here to check the plugin's paths.
func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}
