package csiplugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/csi"
	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

func TestNoStageUnstage(t *testing.T) {
	e := newEnv(t, envOptions{driver: csitest.Options{NoStageUnstage: true, CreateTargetDirs: true}})
	ctx, spec := context.Background(), testSpec(drv)
	// The planner stages nothing: the capability says so.
	if caps, err := e.p.Capabilities(spec); err != nil || caps.Stages {
		t.Fatalf("Capabilities = %+v, %v; want no staging", caps, err)
	}
	target, err := e.p.SetUp(ctx, volume.MountRequest{Spec: spec, Volume: podVolume("a", "data")})
	if err != nil {
		t.Fatalf("SetUp: %v", err)
	}
	pub := e.request(t, "NodePublishVolume").(*csipb.NodePublishVolumeRequest)
	if pub.GetStagingTargetPath() != "" || pub.GetTargetPath() != target {
		t.Errorf("NodePublishVolume staging %q target %q, want no staging path and %s", pub.GetStagingTargetPath(), pub.GetTargetPath(), target)
	}
	assertGone(t, filepath.Join(e.root, "plugins"))
	if err := e.p.UnmountDevice(ctx, volume.DeviceRequest{Spec: spec}); err != nil {
		t.Errorf("UnmountDevice: %v", err)
	}
	if n := e.srv.Calls("NodeStageVolume") + e.srv.Calls("NodeUnstageVolume"); n != 0 {
		t.Errorf("%d stage/unstage calls to a driver without STAGE_UNSTAGE_VOLUME", n)
	}
}

// TestOneConnection: many operations, concurrently, share one connection,
// and the capabilities were fetched once, at registration.
func TestOneConnection(t *testing.T) {
	e := newEnv(t, envOptions{driver: csitest.Options{CreateTargetDirs: true}})
	const n = 20
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for i := range n {
		wg.Go(func() {
			spec := testSpec(drv)
			spec.VolumeHandle, spec.PVName = fmt.Sprintf("vol-%d", i), fmt.Sprintf("pv-%d", i)
			ctx := context.Background()
			staging, err := e.p.MountDevice(ctx, volume.DeviceRequest{Spec: spec})
			if err == nil {
				_, err = e.p.SetUp(ctx, volume.MountRequest{Spec: spec, Volume: podVolume(fmt.Sprint(i), "data"), DeviceMountPath: staging})
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if got := e.srv.Connections(); got != 1 {
		t.Errorf("driver accepted %d connections, want 1", got)
	}
	if got := e.srv.Calls("NodeGetCapabilities"); got != 1 {
		t.Errorf("NodeGetCapabilities called %d times, want 1", got)
	}
	if got := len(e.srv.PublishedVolumes()); got != n {
		t.Errorf("%d volumes published, want %d", got, n)
	}
}

// TestStageErrors: each gRPC code is in progress (directories kept, volume
// uncertain) or final (directories removed).
func TestStageErrors(t *testing.T) {
	e := newEnv(t, envOptions{})
	for code := codes.Canceled; code <= codes.Unauthenticated; code++ {
		t.Run(code.String(), func(t *testing.T) {
			spec := testSpec(drv)
			spec.VolumeHandle = "vol-" + code.String()
			e.srv.Inject(csitest.Fault{Method: "NodeStageVolume", VolumeID: spec.VolumeHandle, Err: status.Error(code, "injected"), Times: 1})
			_, err := e.p.MountDevice(context.Background(), volume.DeviceRequest{Spec: spec})
			if err == nil {
				t.Fatal("MountDevice succeeded")
			}
			if status.Code(err) != code || !strings.Contains(err.Error(), "injected") || !strings.Contains(err.Error(), "pv-1") {
				t.Errorf("error %q: want code %v, the driver's message and the volume", err, code)
			}
			dir, _ := ondisk.StagingDir(e.root, drv, spec.VolumeHandle)
			_, statErr := os.Stat(filepath.Join(dir, ondisk.VolumeDataFile))
			if inProgressCode(code) {
				if !volume.IsUncertain(err) || statErr != nil {
					t.Errorf("in progress: uncertain %v (want true), vol_data.json: %v (want kept)", volume.IsUncertain(err), statErr)
				}
			} else {
				if volume.IsUncertain(err) {
					t.Errorf("final error is uncertain: %v", err)
				}
				assertGone(t, dir)
			}
		})
	}
}

// TestHangingDriver: a call the driver never answers ends at the call
// timeout, in progress, and the caller's context is not blamed.
func TestHangingDriver(t *testing.T) {
	e := newEnv(t, envOptions{callTimeout: 200 * time.Millisecond})
	block := make(chan struct{})
	defer close(block)
	e.srv.Inject(csitest.Fault{Method: "NodeStageVolume", Block: block})
	start := time.Now()
	_, err := e.p.MountDevice(context.Background(), volume.DeviceRequest{Spec: testSpec(drv)})
	if !volume.IsUncertain(err) || status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("MountDevice = %v, want DeadlineExceeded in progress", err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v blames the caller's context, which did not end", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v, want about the 200ms call timeout", d)
	}
	// The caller's context ending first stops the call too, and is named.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = e.p.MountDevice(ctx, volume.DeviceRequest{Spec: testSpec(drv)})
	if !volume.IsUncertain(err) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("MountDevice with an ending context = %v, want in progress and context.DeadlineExceeded", err)
	}
}

func TestDriverNotRegistered(t *testing.T) {
	e := newEnv(t, envOptions{})
	spec := testSpec("other.example.com")
	_, err := e.p.MountDevice(context.Background(), volume.DeviceRequest{Spec: spec})
	if !errors.Is(err, volume.ErrNotReady) || !strings.Contains(err.Error(), "driver name other.example.com not found in the list of registered CSI drivers") {
		t.Errorf("MountDevice = %v, want ErrNotReady naming the driver", err)
	}
	_, err = e.p.SetUp(context.Background(), volume.MountRequest{Spec: spec, Volume: podVolume("a", "data")})
	if !errors.Is(err, volume.ErrNotReady) {
		t.Errorf("SetUp = %v, want ErrNotReady", err)
	}
	assertGone(t, filepath.Join(e.root, "pods"), filepath.Join(e.root, "plugins"))
}

// TestHostileNames: names that would leave their directory are refused
// and nothing is created anywhere.
func TestHostileNames(t *testing.T) {
	e := newEnv(t, envOptions{})
	parent := filepath.Dir(e.root)
	before, _ := os.ReadDir(parent)
	for _, bad := range []string{"..", "../../etc", "a/b", "/abs", "x\x00y", "."} {
		specs := map[string]func() (*podvol.VolumeSpec, podvol.PodVolume){
			"driver": func() (*podvol.VolumeSpec, podvol.PodVolume) {
				s := testSpec(bad)
				return s, podVolume("a", "data")
			},
			"pod UID": func() (*podvol.VolumeSpec, podvol.PodVolume) {
				v := podVolume("a", "data")
				v.Pod.UID = types.UID(bad)
				return testSpec(drv), v
			},
			"PV name": func() (*podvol.VolumeSpec, podvol.PodVolume) {
				s := testSpec(drv)
				s.PVName = bad
				return s, podVolume("a", "data")
			},
			"inline spec name": func() (*podvol.VolumeSpec, podvol.PodVolume) {
				s := testSpec(drv)
				s.PVName, s.Ephemeral = "", true
				return s, podVolume("a", bad)
			},
		}
		for what, mk := range specs {
			spec, vol := mk()
			if _, err := e.p.SetUp(context.Background(), volume.MountRequest{Spec: spec, Volume: vol}); err == nil || !strings.Contains(err.Error(), "invalid") {
				t.Errorf("SetUp with %s %q = %v, want invalid", what, bad, err)
			}
			if err := e.p.TearDown(context.Background(), volume.MountRequest{Spec: spec, Volume: vol}); err == nil {
				t.Errorf("TearDown with %s %q succeeded", what, bad)
			}
		}
		if _, err := e.p.MountDevice(context.Background(), volume.DeviceRequest{Spec: testSpec(bad)}); err == nil {
			t.Errorf("MountDevice with driver %q succeeded", bad)
		}
	}
	after, _ := os.ReadDir(parent)
	if len(before) != len(after) {
		t.Errorf("entries next to the root changed: %v -> %v", before, after)
	}
	assertGone(t, filepath.Join(e.root, "pods"), filepath.Join(e.root, "plugins"))
	if n := e.srv.Calls("NodePublishVolume") + e.srv.Calls("NodeStageVolume"); n != 0 {
		t.Errorf("%d calls reached the driver", n)
	}
}

func TestMissingSecret(t *testing.T) {
	e := newEnv(t, envOptions{})
	spec := testSpec(drv)
	spec.NodePublishSecret = &podvol.SecretRef{Namespace: "ns", Name: "gone"}
	vol := podVolume("a", "data")
	_, err := e.p.SetUp(context.Background(), volume.MountRequest{Spec: spec, Volume: vol, DeviceMountPath: "/s"})
	if err == nil || errors.Is(err, volume.ErrNotReady) || volume.IsUncertain(err) {
		t.Fatalf("SetUp = %v, want a final error", err)
	}
	for _, want := range []string{"ns/gone", "not found", "ns/pod-a", "pv-1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	assertGone(t, filepath.Join(e.root, "pods"))
	spec = testSpec(drv)
	spec.NodeStageSecret = &podvol.SecretRef{Namespace: "ns", Name: "gone"}
	if _, err := e.p.MountDevice(context.Background(), volume.DeviceRequest{Spec: spec}); err == nil || !strings.Contains(err.Error(), "NodeStage secret ns/gone not found") {
		t.Errorf("MountDevice = %v", err)
	}
	assertGone(t, filepath.Join(e.root, "plugins"))
}

// TestInlineWithPodInfo: an inline volume is never staged, is published
// under the pod's volume name, and the driver gets the pod's details.
func TestInlineWithPodInfo(t *testing.T) {
	e := newEnv(t, envOptions{
		driver: csitest.Options{CreateTargetDirs: true},
		objects: []runtime.Object{
			csitest.CSIDriver(drv, csitest.CSIDriverSpec{PodInfoOnMount: true, LifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecycleEphemeral}}),
			csitest.Secret("ns", "pub", map[string]string{"k": "v"}),
		},
	})
	spec := &podvol.VolumeSpec{Name: "inline", Driver: drv, VolumeHandle: "csi-inline", Mode: podvol.Filesystem,
		Ephemeral: true, Attributes: map[string]string{"size": "1Gi"}, NodePublishSecret: &podvol.SecretRef{Name: "pub"}}
	vol := podVolume("a", "scratch")
	ctx := context.Background()
	if pc, err := e.p.WaitForAttach(ctx, spec); pc != nil || err != nil {
		t.Errorf("WaitForAttach = %v, %v", pc, err)
	}
	if path, err := e.p.MountDevice(ctx, volume.DeviceRequest{Spec: spec}); path != "" || err != nil {
		t.Errorf("MountDevice = %q, %v", path, err)
	}
	target, err := e.p.SetUp(ctx, volume.MountRequest{Spec: spec, Volume: vol})
	if err != nil {
		t.Fatalf("SetUp: %v", err)
	}
	if want := filepath.Join(e.root, "pods/uid-a/volumes/kubernetes.io~csi/scratch/mount"); target != want {
		t.Errorf("target = %s, want %s", target, want)
	}
	pub := e.request(t, "NodePublishVolume").(*csipb.NodePublishVolumeRequest)
	wantCtx := map[string]string{"size": "1Gi", podNameKey: "pod-a", podNamespaceKey: "ns", podUIDKey: "uid-a",
		serviceAccountNameKey: "sa", ephemeralKey: "true"}
	if fmt.Sprint(pub.GetVolumeContext()) != fmt.Sprint(wantCtx) || pub.GetSecrets()["k"] != "v" || pub.GetStagingTargetPath() != "" {
		t.Errorf("NodePublishVolume context %v secrets-present %v staging %q", pub.GetVolumeContext(), len(pub.GetSecrets()) > 0, pub.GetStagingTargetPath())
	}
	if spec.Attributes[podNameKey] != "" {
		t.Error("SetUp changed the spec's attributes")
	}
	if d := volData(t, filepath.Dir(target)); d.VolumeLifecycleMode != "Ephemeral" || d.SpecVolID != "scratch" {
		t.Errorf("vol_data.json = %+v", d)
	}
	if n := e.srv.Calls("NodeStageVolume"); n != 0 {
		t.Errorf("inline volume staged %d times", n)
	}
	// The planner refuses a persistent volume of an Ephemeral-only driver:
	// the capabilities list the driver's modes.
	if caps, err := e.p.Capabilities(testSpec(drv)); err != nil || fmt.Sprint(caps.LifecycleModes) != "[Ephemeral]" {
		t.Errorf("Capabilities = %+v, %v; want lifecycle modes [Ephemeral]", caps, err)
	}
}

func TestTearDownKeepsMountPoint(t *testing.T) {
	e := newEnv(t, envOptions{})
	spec, vol := testSpec(drv), podVolume("a", "data")
	staging, err := e.p.MountDevice(context.Background(), volume.DeviceRequest{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	target, err := e.p.SetUp(context.Background(), volume.MountRequest{Spec: spec, Volume: vol, DeviceMountPath: staging})
	if err != nil {
		t.Fatal(err)
	}
	// The driver "forgot" to unmount: the target stays a mount point.
	if err := os.MkdirAll(target, 0o750); err != nil {
		t.Fatal(err)
	}
	e.mounter.MountPoints = append(e.mounter.MountPoints, mount.MountPoint{Path: target, Device: "/dev/x", Type: "ext4"})
	err = e.p.TearDown(context.Background(), volume.MountRequest{Spec: spec, Volume: vol})
	if err == nil || !strings.Contains(err.Error(), "still a mount point") {
		t.Fatalf("TearDown = %v, want still a mount point", err)
	}
	if _, err := os.Stat(target); err != nil {
		t.Errorf("mounted target was removed: %v", err)
	}
}

func TestAccessModes(t *testing.T) {
	tests := []struct {
		mode string
		snmw bool
		want csipb.VolumeCapability_AccessMode_Mode
	}{
		{"ReadWriteOnce", false, csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		{"ReadWriteOnce", true, csipb.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER},
		{"ReadOnlyMany", false, csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY},
		{"ReadOnlyMany", true, csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY},
		{"ReadWriteMany", true, csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER},
		{"ReadWriteOncePod", false, csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		{"ReadWriteOncePod", true, csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER},
		// No access mode (an inline volume, a PV without accessModes):
		// ReadWriteOnce, as the kubelet sends it.
		{"", false, csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		{"", true, csipb.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER},
		{"ReadWriteSometimes", true, csipb.VolumeCapability_AccessMode_UNKNOWN},
	}
	for _, tt := range tests {
		if got := (csi.Capabilities{SingleNodeMultiWriter: tt.snmw}).AccessMode(tt.mode); got != tt.want {
			t.Errorf("AccessMode(%q, SNMW=%v) = %v, want %v", tt.mode, tt.snmw, got, tt.want)
		}
	}
	// Over the wire, with the driver's capability fetched at registration.
	e := newEnv(t, envOptions{driver: csitest.Options{SingleNodeMultiWriter: true}})
	spec := testSpec(drv)
	spec.AccessMode = "ReadWriteOncePod"
	if _, err := e.p.MountDevice(context.Background(), volume.DeviceRequest{Spec: spec}); err != nil {
		t.Fatal(err)
	}
	stage := e.request(t, "NodeStageVolume").(*csipb.NodeStageVolumeRequest)
	if got := stage.GetVolumeCapability().GetAccessMode().GetMode(); got != csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER {
		t.Errorf("staged with %v", got)
	}
	block := volumeCapability(&podvol.VolumeSpec{Mode: podvol.Block, AccessMode: "ReadWriteOnce"}, csi.Capabilities{}, nil)
	if block.GetBlock() == nil || block.GetMount() != nil {
		t.Errorf("Block mode capability = %v", block)
	}
}

// TestMissingSecretWords: a Secret a CSI call needs that does not exist is
// a final error whose kubelet's words (what a pod's event says) are the
// kubelet's CSI plugin's for that call and mode, with the API's error.
func TestMissingSecretWords(t *testing.T) {
	e := newEnv(t, envOptions{driver: csitest.Options{Expand: true}})
	gone := &podvol.SecretRef{Namespace: "ns", Name: "gone"}
	const find = `kubernetes.io/csi: failed to find the secret gone in the namespace ns with error: secrets "gone" not found`
	ctx := context.Background()
	spec := func(mode podvol.VolumeMode, set func(*podvol.VolumeSpec)) *podvol.VolumeSpec {
		s := testSpec(drv)
		s.Mode = mode
		set(s)
		return s
	}
	publish := func(s *podvol.VolumeSpec) *podvol.VolumeSpec { s.NodePublishSecret = gone; return s }
	stage := func(s *podvol.VolumeSpec) *podvol.VolumeSpec { s.NodeStageSecret = gone; return s }
	tests := []struct {
		name string
		call func() error
		want string
	}{
		{"publish", func() error {
			_, err := e.p.SetUp(ctx, volume.MountRequest{Spec: spec(podvol.Filesystem, func(s *podvol.VolumeSpec) { publish(s) }), Volume: podVolume("a", "data"), DeviceMountPath: "/s"})
			return err
		}, "fetching NodePublishSecretRef ns/gone failed: " + find},
		{"stage", func() error {
			_, err := e.p.MountDevice(ctx, volume.DeviceRequest{Spec: spec(podvol.Filesystem, func(s *podvol.VolumeSpec) { stage(s) })})
			return err
		}, "fetching NodeStageSecretRef ns/gone failed: " + find},
		{"block publish", func() error {
			_, err := e.p.SetUp(ctx, volume.MountRequest{Spec: spec(podvol.Block, func(s *podvol.VolumeSpec) { publish(s) }), Volume: podVolume("a", "data")})
			return err
		}, "kubernetes.io/csi: blockMapper.publishVolumeForBlock failed to get NodePublishSecretRef ns/gone: " + find},
		{"block stage", func() error {
			_, err := e.p.MountDevice(ctx, volume.DeviceRequest{Spec: spec(podvol.Block, func(s *podvol.VolumeSpec) { stage(s) })})
			return err
		}, "kubernetes.io/csi: failed to get NodeStageSecretRef ns/gone: " + find},
		{"expand", func() error {
			_, err := e.p.NodeExpand(ctx, volume.ExpandRequest{Spec: spec(podvol.Filesystem, func(s *podvol.VolumeSpec) { s.NodeExpandSecret = gone }),
				Pod: "uid-a", VolumePath: "/v", Size: 2 << 30})
			return err
		}, "expander.NodeExpand failed to get NodeExpandSecretRef ns/gone: " + find},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if err == nil || errors.Is(err, volume.ErrNotReady) || !strings.Contains(err.Error(), "secret ns/gone not found") {
				t.Fatalf("error %v, want a final error naming the Secret", err)
			}
			if _, cause := volume.EventCause(err); cause != tt.want {
				t.Errorf("the kubelet's words\n%q\nwant\n%q", cause, tt.want)
			}
		})
	}
}

// inProgressCode reports whether a CSI call that failed with code may
// still finish, as the kubelet reads the code: the volume is uncertain.
func inProgressCode(code codes.Code) bool {
	switch code {
	case codes.Canceled, codes.DeadlineExceeded, codes.Unavailable, codes.ResourceExhausted, codes.Aborted:
		return true
	}
	return false
}
