package operationexecutor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/nodevol/nodevol/cache"
)

// fakePlugin returns fixed answers and records what it was asked.
type fakePlugin struct {
	err   error
	calls []string
	req   MountRequest
}

func (f *fakePlugin) WaitForAttach(context.Context, *cache.VolumeSpec) (map[string]string, error) {
	f.calls = append(f.calls, "attach")
	return map[string]string{"dev": "/dev/x"}, f.err
}
func (f *fakePlugin) MountDevice(context.Context, DeviceRequest) (string, error) {
	f.calls = append(f.calls, "stage")
	return "/stage", f.err
}
func (f *fakePlugin) UnmountDevice(context.Context, DeviceRequest) error {
	f.calls = append(f.calls, "unstage")
	return f.err
}
func (f *fakePlugin) SetUp(_ context.Context, r MountRequest) (string, error) {
	f.calls = append(f.calls, "publish")
	f.req = r
	return "/pod", f.err
}
func (f *fakePlugin) TearDown(context.Context, MountRequest) error {
	f.calls = append(f.calls, "unpublish")
	return f.err
}

var _ Plugin = (*fakePlugin)(nil)

func TestDoOutcomes(t *testing.T) {
	spec := cache.VolumeSpec{Name: "vol", Driver: "drv"}
	pv := cache.PodVolume{Pod: cache.PodRef{UID: "u1", Namespace: "ns", Name: "p"}, SpecName: "data"}
	tests := []struct {
		kind          OpKind
		err           error
		wantCall      string
		wantPath      string
		wantUncertain bool
	}{
		{OpAttach, nil, "attach", "", false},
		{OpStage, nil, "stage", "/stage", false},
		{OpStage, fmt.Errorf("rpc: %w", ErrInProgress), "stage", "/stage", true},
		{OpPublish, nil, "publish", "/pod", false},
		{OpPublish, errors.New("final"), "publish", "/pod", false},
		{OpUnpublish, fmt.Errorf("x: %w", ErrInProgress), "unpublish", "", true},
		{OpUnstage, nil, "unstage", "", false},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s/%v", tc.kind, tc.err), func(t *testing.T) {
			p := &fakePlugin{err: tc.err}
			a := Action{Kind: tc.kind, Volume: spec.Name, Pod: pv}
			got := Do(context.Background(), p, a, Input{Spec: spec, PublishContext: map[string]string{"a": "b"}, DeviceMountPath: "/stage"})
			if len(p.calls) != 1 || p.calls[0] != tc.wantCall {
				t.Fatalf("calls %v", p.calls)
			}
			if got.Path != tc.wantPath || got.Uncertain != tc.wantUncertain || (got.Err == nil) != (tc.err == nil) {
				t.Fatalf("outcome %+v", got)
			}
			if tc.err != nil && !errors.Is(got.Err, tc.err) {
				t.Fatalf("error %v does not wrap %v", got.Err, tc.err)
			}
			if tc.err != nil && !strings.Contains(got.Err.Error(), `volume "vol" (driver drv`) {
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

func TestCSICall(t *testing.T) {
	tests := []struct {
		kind OpKind
		want string
	}{
		{OpAttach, ""},
		{OpStage, "NodeStageVolume"},
		{OpPublish, "NodePublishVolume"},
		{OpUnpublish, "NodeUnpublishVolume"},
		{OpUnstage, "NodeUnstageVolume"},
		{OpExpand, "NodeExpandVolume"},
	}
	for _, tc := range tests {
		if got := tc.kind.CSICall(); got != tc.want {
			t.Errorf("%s.CSICall() = %q, want %q", tc.kind, got, tc.want)
		}
	}
}

func TestActionKeys(t *testing.T) {
	pv := cache.PodVolume{Pod: cache.PodRef{UID: "u1"}}
	if k := (Action{Kind: OpPublish, Volume: "v", Pod: pv}).Key(); k != (Key{Volume: "v", Pod: "u1"}) {
		t.Fatalf("publish key %v", k)
	}
	if k := (Action{Kind: OpStage, Volume: "v", Pod: pv}).Key(); k != (Key{Volume: "v"}) {
		t.Fatalf("stage key %v", k)
	}
}

func TestInUseError(t *testing.T) {
	err := fmt.Errorf("unstaging: %w", &InUseError{Path: "/stage", Refs: []string{"/pods/a/mount"}})
	var iu *InUseError
	if !errors.Is(err, ErrInUse) || !errors.As(err, &iu) || iu.Refs[0] != "/pods/a/mount" {
		t.Fatalf("%v: Is(ErrInUse)=%v", err, errors.Is(err, ErrInUse))
	}
}
