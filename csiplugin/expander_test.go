package csiplugin

import (
	"context"
	"errors"
	"fmt"
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

// TestClassifyExpandError: what a failed NodeExpandVolume means for the
// claim, as the kubelet's node expander decides it.
func TestClassifyExpandError(t *testing.T) {
	call := func(code codes.Code) error {
		err := &csi.CallError{Driver: "d.example.com", Method: "NodeExpandVolume", Code: code, InProgress: csi.IsInProgressCode(code), Err: status.Error(code, "no")}
		return fmt.Errorf("expanding volume v: %w", err)
	}
	tests := []struct {
		name string
		err  error
		want ExpandFailure
	}{
		{"InvalidArgument", call(codes.InvalidArgument), ExpandInfeasible},
		{"OutOfRange", call(codes.OutOfRange), ExpandInfeasible},
		{"NotFound", call(codes.NotFound), ExpandInfeasible},
		{"FailedPrecondition", call(codes.FailedPrecondition), ExpandInUse},
		{"Internal", call(codes.Internal), ExpandFailed},
		{"Unimplemented", call(codes.Unimplemented), ExpandFailed},
		{"Unavailable (may still run)", call(codes.Unavailable), ExpandTransient},
		{"DeadlineExceeded (may still run)", call(codes.DeadlineExceeded), ExpandTransient},
		{"driver not registered", fmt.Errorf("driver d: %w", volume.ErrNotReady), ExpandTransient},
		{"not a call (secret missing)", errors.New("secret ns/s not found"), ExpandFailed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ClassifyExpandError(tt.err); got != tt.want {
				t.Errorf("ClassifyExpandError(%v) = %v, want %v", tt.err, got, tt.want)
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
