package csiplugin

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/nodevol/nodevol/csi"
	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/volume"
)

// TestExpandErrorClass: what a failed NodeExpandVolume means, as the
// kubelet's node expander reads its code, in the contract's classes:
// refused as infeasible, refused while in use, in progress (or not ready)
// or none of those (a final failure).
func TestExpandErrorClass(t *testing.T) {
	call := func(code codes.Code) error {
		err := &csi.CallError{Driver: "d.example.com", Method: "NodeExpandVolume", Code: code, InProgress: inProgressCode(code), Err: status.Error(code, "no")}
		return fmt.Errorf("expanding volume v: %w", err)
	}
	tests := []struct {
		name       string
		err        error
		want       error // the class expandErrorClass adds
		inProgress bool  // the class the error carries already
	}{
		{"InvalidArgument", call(codes.InvalidArgument), volume.ErrInfeasible, false},
		{"OutOfRange", call(codes.OutOfRange), volume.ErrInfeasible, false},
		{"NotFound", call(codes.NotFound), volume.ErrInfeasible, false},
		{"FailedPrecondition", call(codes.FailedPrecondition), volume.ErrNotWhileInUse, false},
		{"Internal", call(codes.Internal), nil, false},
		{"Unimplemented", call(codes.Unimplemented), nil, false},
		{"Unavailable (may still run)", call(codes.Unavailable), nil, true},
		{"DeadlineExceeded (may still run)", call(codes.DeadlineExceeded), nil, true},
		{"driver not registered", fmt.Errorf("driver d: %w", volume.ErrNotReady), nil, false},
		{"not a call (secret missing)", errors.New("secret ns/s not found"), nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := expandErrorClass(tt.err); got != tt.want {
				t.Errorf("expandErrorClass(%v) = %v, want %v", tt.err, got, tt.want)
			}
			if got := volume.IsUncertain(tt.err); got != tt.inProgress {
				t.Errorf("IsUncertain(%v) = %v, want %v", tt.err, got, tt.inProgress)
			}
		})
	}
}

// TestNodeExpandErrorClass: NodeExpand's error carries the contract's
// class of a refusal beside the gRPC status, and its text and the
// kubelet's words stay the call's.
func TestNodeExpandErrorClass(t *testing.T) {
	for _, tt := range []struct {
		code  codes.Code
		class error
		words string
	}{
		{codes.OutOfRange, volume.ErrInfeasible, "Expander.NodeExpand failed to expand the volume rpc error: code = OutOfRange desc = no room"},
		{codes.FailedPrecondition, volume.ErrNotWhileInUse, "Expander.NodeExpand failed to expand the volume : rpc error: code = FailedPrecondition desc = no room"},
		{codes.Internal, nil, "Expander.NodeExpand failed to expand the volume : rpc error: code = Internal desc = no room"},
	} {
		t.Run(tt.code.String(), func(t *testing.T) {
			e := newEnv(t, envOptions{driver: csitest.Options{Expand: true}})
			e.srv.Inject(csitest.Fault{Method: "NodeExpandVolume", Err: status.Error(tt.code, "no room")})
			_, err := e.p.NodeExpand(context.Background(), volume.ExpandRequest{Spec: testSpec(drv), Pod: "uid-a", VolumePath: "/p", Size: 2 << 30})
			if err == nil {
				t.Fatal("NodeExpand: no error")
			}
			for _, c := range []error{volume.ErrInfeasible, volume.ErrNotWhileInUse} {
				if got, want := errors.Is(err, c), c == tt.class; got != want {
					t.Errorf("errors.Is(err, %v) = %v, want %v", c, got, want)
				}
			}
			if status.Code(err) != tt.code {
				t.Errorf("status.Code = %v, want %v", status.Code(err), tt.code)
			}
			if _, cause := volume.EventCause(err); cause != tt.words {
				t.Errorf("cause = %q, want %q", cause, tt.words)
			}
			if !strings.Contains(err.Error(), "expanding volume") {
				t.Errorf("error %q lost its context", err)
			}
		})
	}
}

// TestNodeExpandBlockWithoutStaging: a block volume of a driver that does
// not stage is grown with the pod's publish path and no staging path,
// whatever the caller passed.
func TestNodeExpandBlockWithoutStaging(t *testing.T) {
	e := newEnv(t, envOptions{driver: csitest.Options{CreateTargetDirs: true, NoStageUnstage: true, Expand: true}})
	e.p.blockMapper = &fakeBlockMapper{}
	spec := blockSpec()
	vol := podVolume("a", "data")
	if _, err := e.p.SetUp(context.Background(), volume.MountRequest{Spec: spec, Volume: vol}); err != nil {
		t.Fatal(err)
	}
	paths, err := ondisk.BlockVolumePaths(e.root, spec.PVName, vol.Pod.UID)
	if err != nil {
		t.Fatal(err)
	}
	expanded, err := e.p.NodeExpand(context.Background(), volume.ExpandRequest{Spec: spec, Pod: vol.Pod.UID, VolumePath: "/elsewhere", StagingPath: "/elsewhere", Size: 3 << 30})
	if err != nil || !expanded {
		t.Fatalf("NodeExpand = %v, %v", expanded, err)
	}
	want := &csipb.NodeExpandVolumeRequest{
		VolumeId:         spec.VolumeHandle,
		VolumePath:       paths.PublishPath,
		CapacityRange:    &csipb.CapacityRange{RequiredBytes: 3 << 30},
		VolumeCapability: volumeCapability(spec, csi.Capabilities{}, nil),
	}
	if got := e.request(t, "NodeExpandVolume"); !proto.Equal(got, want) {
		t.Errorf("NodeExpandVolume request\n got %v\nwant %v", got, want)
	}
}
