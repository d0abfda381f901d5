package csiplugin

import (
	"context"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/volume"
)

// TestVolumeMountGroupAtStage: a driver with VOLUME_MOUNT_GROUP gets the
// fsGroup of the pod being mounted as volume_mount_group in
// NodeStageVolume, as in NodePublishVolume, whatever the volume's fsType
// or access mode, unless its CSIDriver's fsGroupPolicy is None; a driver
// without the capability, or a pod without fsGroup, gets none.
func TestVolumeMountGroupAtStage(t *testing.T) {
	policy := func(p storagev1.FSGroupPolicy) *storagev1.CSIDriver {
		return csitest.CSIDriver(drv, csitest.CSIDriverSpec{FSGroupPolicy: p})
	}
	gid := int64(2345)
	tests := []struct {
		name       string
		mountGroup bool
		driver     []runtime.Object
		fsGroup    *int64
		accessMode string
		fsType     string
		want       string
	}{
		{name: "File", mountGroup: true, driver: []runtime.Object{policy(storagev1.FileFSGroupPolicy)}, fsGroup: &gid, want: "2345"},
		{name: "ReadWriteOnceWithFSType", mountGroup: true, driver: []runtime.Object{csitest.CSIDriver(drv, csitest.CSIDriverSpec{})}, fsGroup: &gid, want: "2345"},
		{name: "ReadWriteOnceWithFSType, RWX without fsType", mountGroup: true, driver: []runtime.Object{csitest.CSIDriver(drv, csitest.CSIDriverSpec{})},
			fsGroup: &gid, accessMode: "ReadWriteMany", want: "2345"},
		{name: "no CSIDriver", mountGroup: true, fsGroup: &gid, want: "2345"},
		{name: "None", mountGroup: true, driver: []runtime.Object{policy(storagev1.NoneFSGroupPolicy)}, fsGroup: &gid},
		{name: "no VOLUME_MOUNT_GROUP", driver: []runtime.Object{policy(storagev1.FileFSGroupPolicy)}, fsGroup: &gid},
		{name: "pod without fsGroup", mountGroup: true, driver: []runtime.Object{policy(storagev1.FileFSGroupPolicy)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, envOptions{objects: tt.driver, driver: csitest.Options{VolumeMountGroup: tt.mountGroup, CreateTargetDirs: true}})
			spec := testSpec(drv)
			spec.FSType = "ext4"
			if tt.accessMode != "" {
				spec.AccessMode, spec.FSType = tt.accessMode, ""
			}
			vol := podVolume("a", "data")
			vol.FSGroup = tt.fsGroup
			ctx := context.Background()
			staging, err := e.p.MountDevice(ctx, volume.DeviceRequest{Spec: spec, Pod: vol})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.p.SetUp(ctx, volume.MountRequest{Spec: spec, Volume: vol, DeviceMountPath: staging}); err != nil {
				t.Fatal(err)
			}
			want := &csipb.VolumeCapability_MountVolume{FsType: spec.FSType, VolumeMountGroup: tt.want}
			stage := e.request(t, "NodeStageVolume").(*csipb.NodeStageVolumeRequest)
			if diff := cmp.Diff(want, stage.GetVolumeCapability().GetMount(), protocmp.Transform()); diff != "" {
				t.Errorf("NodeStageVolume mount capability (-want +got):\n%s", diff)
			}
			publish := e.request(t, "NodePublishVolume").(*csipb.NodePublishVolumeRequest)
			if diff := cmp.Diff(want, publish.GetVolumeCapability().GetMount(), protocmp.Transform()); diff != "" {
				t.Errorf("NodePublishVolume mount capability (-want +got):\n%s", diff)
			}
		})
	}
}
