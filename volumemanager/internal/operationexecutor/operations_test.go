package operationexecutor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/image"
)

// fakePlugin returns fixed answers and records what it was asked.
type fakePlugin struct {
	err   error
	calls []string
	req   volume.MountRequest
}

func (f *fakePlugin) Name() string               { return "example.com/fake" }
func (f *fakePlugin) CanSupport(*v1.Volume) bool { return false }
func (f *fakePlugin) Capabilities(*podvol.VolumeSpec) (volume.Capabilities, error) {
	return volume.Capabilities{Attachable: true, Stages: true}, nil
}

func (f *fakePlugin) WaitForAttach(context.Context, *podvol.VolumeSpec) (map[string]string, error) {
	f.calls = append(f.calls, "attach")
	return map[string]string{"dev": "/dev/x"}, f.err
}
func (f *fakePlugin) MountDevice(context.Context, volume.DeviceRequest) (string, error) {
	f.calls = append(f.calls, "stage")
	return "/stage", f.err
}
func (f *fakePlugin) UnmountDevice(context.Context, volume.DeviceRequest) error {
	f.calls = append(f.calls, "unstage")
	return f.err
}
func (f *fakePlugin) SetUp(_ context.Context, r volume.MountRequest) (string, error) {
	f.calls = append(f.calls, "publish")
	f.req = r
	return "/pod", f.err
}
func (f *fakePlugin) TearDown(context.Context, volume.MountRequest) error {
	f.calls = append(f.calls, "unpublish")
	return f.err
}

var (
	_ volume.Plugin        = (*fakePlugin)(nil)
	_ volume.Attacher      = (*fakePlugin)(nil)
	_ volume.DeviceMounter = (*fakePlugin)(nil)
)

// registry returns a registry holding p.
func registry(t *testing.T, p volume.Plugin) *volume.Registry {
	t.Helper()
	r, err := volume.NewRegistry(p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestDoOutcomes(t *testing.T) {
	spec := podvol.VolumeSpec{Name: "example.com/fake/vol", Driver: "drv"}
	pv := podvol.PodVolume{Pod: podvol.PodRef{UID: "u1", Namespace: "ns", Name: "p"}, SpecName: "data"}
	tests := []struct {
		kind          OpKind
		err           error
		wantCall      string
		wantPath      string
		wantUncertain bool
	}{
		{OpAttach, nil, "attach", "", false},
		{OpStage, nil, "stage", "/stage", false},
		{OpStage, fmt.Errorf("rpc: %w", volume.ErrInProgress), "stage", "/stage", true},
		{OpPublish, nil, "publish", "/pod", false},
		{OpPublish, errors.New("final"), "publish", "/pod", false},
		{OpUnpublish, fmt.Errorf("x: %w", volume.ErrInProgress), "unpublish", "", true},
		{OpUnstage, nil, "unstage", "", false},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s/%v", tc.kind, tc.err), func(t *testing.T) {
			p := &fakePlugin{err: tc.err}
			a := Action{Kind: tc.kind, Volume: spec.Name, Pod: pv}
			got := Do(context.Background(), registry(t, p), a, Input{Spec: spec, PublishContext: map[string]string{"a": "b"}, DeviceMountPath: "/stage"})
			if len(p.calls) != 1 || p.calls[0] != tc.wantCall {
				t.Fatalf("calls %v", p.calls)
			}
			if got.Path != tc.wantPath || got.Uncertain != tc.wantUncertain || (got.Err == nil) != (tc.err == nil) {
				t.Fatalf("outcome %+v", got)
			}
			if tc.err != nil && !errors.Is(got.Err, tc.err) {
				t.Fatalf("error %v does not wrap %v", got.Err, tc.err)
			}
			if tc.err != nil && !strings.Contains(got.Err.Error(), `volume "example.com/fake/vol" (driver drv`) {
				t.Fatalf("error %q does not name the volume and driver", got.Err)
			}
			if tc.kind == OpAttach && got.PublishContext["dev"] != "/dev/x" {
				t.Fatalf("publish context %v", got.PublishContext)
			}
			if tc.kind == OpPublish && (p.req.DeviceMountPath != "/stage" || p.req.PublishContext["a"] != "b" || p.req.Volume.SpecName != "data") {
				t.Fatalf("publish request %+v", p.req)
			}
		})
	}
}

func TestStepAndMethod(t *testing.T) {
	tests := []struct {
		kind          OpKind
		method        volume.Method
		step, onBlock string
	}{
		{OpAttach, volume.MethodWaitForAttach, "MountVolume.WaitForAttach", "MapVolume.WaitForAttach"},
		{OpSelfAttach, volume.MethodAttach, "AttachVolume.Attach", "AttachVolume.Attach"},
		{OpStage, volume.MethodMountDevice, "MountVolume.MountDevice", "MapVolume.SetUpDevice"},
		{OpPublish, volume.MethodSetUp, "MountVolume.SetUp", "MapVolume.MapPodDevice"},
		{OpUnpublish, volume.MethodTearDown, "UnmountVolume.TearDown", "UnmapVolume.UnmapPodDevice"},
		{OpUnstage, volume.MethodUnmountDevice, "UnmountDevice", "UnmapDevice.TearDownDevice"},
		{OpExpand, volume.MethodNodeExpand, "NodeExpandVolume.NodeExpandVolume", "NodeExpandVolume.NodeExpandVolume"},
		{OpSelfDetach, volume.MethodDetach, "DetachVolume.Detach", "DetachVolume.Detach"},
	}
	for _, tc := range tests {
		if got := tc.kind.Method(); got != tc.method {
			t.Errorf("%s.Method() = %q, want %q", tc.kind, got, tc.method)
		}
		if got := tc.kind.Step(podvol.Filesystem); got != tc.step {
			t.Errorf("%s.Step(Filesystem) = %q, want %q", tc.kind, got, tc.step)
		}
		if got := tc.kind.Step(podvol.Block); got != tc.onBlock {
			t.Errorf("%s.Step(Block) = %q, want %q", tc.kind, got, tc.onBlock)
		}
	}
}

func TestActionKeys(t *testing.T) {
	pv := podvol.PodVolume{Pod: podvol.PodRef{UID: "u1"}}
	if k := (Action{Kind: OpPublish, Volume: "v", Pod: pv}).Key(); k != (Key{Volume: "v", Pod: "u1"}) {
		t.Fatalf("publish key %v", k)
	}
	if k := (Action{Kind: OpStage, Volume: "v", Pod: pv}).Key(); k != (Key{Volume: "v"}) {
		t.Fatalf("stage key %v", k)
	}
}

// publishOnly is named apart from fakePlugin; wrapped in a struct{ volume.Plugin }
// it has nothing but the contract's minimum (no Attacher, no DeviceMounter).
type publishOnly struct{ fakePlugin }

func (publishOnly) Name() string { return "example.com/publish-only" }

func TestDoFindsThePluginOfTheVolume(t *testing.T) {
	r, err := volume.NewRegistry(&fakePlugin{}, struct{ volume.Plugin }{&publishOnly{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	do := func(kind OpKind, name podvol.UniqueVolumeName) Outcome {
		return Do(ctx, r, Action{Kind: kind, Volume: name}, Input{Spec: podvol.VolumeSpec{Name: name, Driver: "drv"}})
	}
	if out := do(OpStage, "example.com/fake/v"); out.Err != nil || out.Path != "/stage" {
		t.Errorf("stage with the fake plugin: %+v", out)
	}
	if out := do(OpPublish, "example.com/publish-only/v"); out.Err != nil || out.Path != "/pod" {
		t.Errorf("publish with the publish-only plugin: %+v", out)
	}
	out := do(OpStage, "example.com/publish-only/v")
	if out.Err == nil || !strings.Contains(out.Err.Error(), "volume plugin example.com/publish-only cannot run mount_device") || out.Uncertain {
		t.Errorf("stage with a plugin that does not stage: %+v", out)
	}
	out = do(OpPublish, "example.com/other/v")
	if !errors.Is(out.Err, volume.ErrNoPlugin) || !strings.Contains(out.Err.Error(), `volume_mount failed for volume "example.com/other/v"`) {
		t.Errorf("publish of a volume no plugin handles: %+v", out)
	}
}

// TestDoImageVolume: the executor runs an image volume's operations with
// the image plugin, found by the volume's name beside another plugin.
func TestDoImageVolume(t *testing.T) {
	r, err := volume.NewRegistry(&fakePlugin{}, image.New())
	if err != nil {
		t.Fatal(err)
	}
	name := podvol.UniqueVolumeName("kubernetes.io/image/u1-tools")
	pv := podvol.PodVolume{Pod: podvol.PodRef{UID: "u1", Namespace: "ns", Name: "p"}, SpecName: "tools"}
	in := Input{Spec: podvol.VolumeSpec{Name: name}}
	for _, kind := range []OpKind{OpPublish, OpUnpublish} {
		if out := Do(context.Background(), r, Action{Kind: kind, Volume: name, Pod: pv}, in); out.Err != nil || out.Path != "" {
			t.Errorf("%s of an image volume: %+v", kind, out)
		}
	}
	if out := Do(context.Background(), r, Action{Kind: OpAttach, Volume: name}, in); out.Err == nil {
		t.Errorf("attach of an image volume: %+v", out)
	}
}

// TestOpError: an operation's error names the operation (the block name
// for a raw block volume), the volume, the driver and, for a pod's publish,
// unpublish or expansion, the pod; it is an *Error whose Err is what
// failed, so that the volume manager's event can word that alone.
func TestOpError(t *testing.T) {
	pod := podvol.PodVolume{Pod: podvol.PodRef{UID: "u", Namespace: "ns", Name: "web"}, SpecName: "data"}
	boom := errors.New("boom")
	fs := podvol.VolumeSpec{Name: "kubernetes.io/csi/drv^h", Driver: "drv", Mode: podvol.Filesystem}
	blk := fs
	blk.Mode = podvol.Block
	tests := []struct {
		a    Action
		spec podvol.VolumeSpec
		want string
	}{
		{Action{Kind: OpStage, Pod: pod}, fs, `mount_device failed for volume "kubernetes.io/csi/drv^h" (driver drv): boom`},
		{Action{Kind: OpPublish, Pod: pod}, fs, `volume_mount failed for volume "kubernetes.io/csi/drv^h" (driver drv, pod ns/web): boom`},
		{Action{Kind: OpPublish, Pod: pod}, blk, `map_volume failed for volume "kubernetes.io/csi/drv^h" (driver drv, pod ns/web): boom`},
		{Action{Kind: OpExpand, Pod: pod}, fs, `volume_fs_resize failed for volume "kubernetes.io/csi/drv^h" (driver drv, pod ns/web): boom`},
		{Action{Kind: OpUnstage}, blk, `unmap_device failed for volume "kubernetes.io/csi/drv^h" (driver drv): boom`},
	}
	for _, tt := range tests {
		err := OpError(tt.a, tt.spec, boom)
		if err.Error() != tt.want {
			t.Errorf("%s: %q, want %q", tt.a.Kind, err, tt.want)
		}
		var e *Error
		if !errors.As(err, &e) || e.Err != boom || !errors.Is(err, boom) {
			t.Errorf("%s: %#v does not carry what failed", tt.a.Kind, err)
		}
	}
}
