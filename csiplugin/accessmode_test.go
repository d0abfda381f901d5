package csiplugin

import (
	"context"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/volume"
)

// TestAccessModeRequests: the volume capability NodeStageVolume and
// NodePublishVolume carry, exactly, for each PV access mode, with and
// without the driver's SINGLE_NODE_MULTI_WRITER capability: the kubelet's
// mapping (csi_client.go asCSIAccessModeV1; a PV without access modes and
// an inline volume go as ReadWriteOnce).
func TestAccessModeRequests(t *testing.T) {
	const (
		snw  = csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
		snmw = csipb.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER
		snsw = csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
		mnro = csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
		mnmw = csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
	)
	tests := []struct {
		mode string
		snmw bool
		want csipb.VolumeCapability_AccessMode_Mode
	}{
		{mode: "ReadWriteOnce", want: snw},
		{mode: "ReadWriteOnce", snmw: true, want: snmw},
		{mode: "ReadWriteOncePod", want: snw},
		{mode: "ReadWriteOncePod", snmw: true, want: snsw},
		{mode: "ReadOnlyMany", want: mnro},
		{mode: "ReadOnlyMany", snmw: true, want: mnro},
		{mode: "ReadWriteMany", want: mnmw},
		{mode: "ReadWriteMany", snmw: true, want: mnmw},
		{mode: "", want: snw},
		{mode: "", snmw: true, want: snmw},
	}
	for _, tt := range tests {
		t.Run(tt.mode+map[bool]string{true: "/SNMW", false: ""}[tt.snmw], func(t *testing.T) {
			e := newEnv(t, envOptions{driver: csitest.Options{SingleNodeMultiWriter: tt.snmw, CreateTargetDirs: true}})
			spec := testSpec(drv)
			spec.AccessMode = tt.mode
			ctx := context.Background()
			staging, err := e.p.MountDevice(ctx, volume.DeviceRequest{Spec: spec})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.p.SetUp(ctx, volume.MountRequest{Spec: spec, Volume: podVolume("a", "data"), DeviceMountPath: staging}); err != nil {
				t.Fatal(err)
			}
			want := &csipb.VolumeCapability{
				AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: "ext4"}},
				AccessMode: &csipb.VolumeCapability_AccessMode{Mode: tt.want},
			}
			stage := e.request(t, "NodeStageVolume").(*csipb.NodeStageVolumeRequest)
			if diff := cmp.Diff(want, stage.GetVolumeCapability(), protocmp.Transform()); diff != "" {
				t.Errorf("NodeStageVolume volume_capability (-want +got):\n%s", diff)
			}
			publish := e.request(t, "NodePublishVolume").(*csipb.NodePublishVolumeRequest)
			if diff := cmp.Diff(want, publish.GetVolumeCapability(), protocmp.Transform()); diff != "" {
				t.Errorf("NodePublishVolume volume_capability (-want +got):\n%s", diff)
			}
		})
	}
}
