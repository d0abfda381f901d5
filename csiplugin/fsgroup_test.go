package csiplugin

import (
	"context"
	"io/fs"
	"os"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/nodevol/nodevol/csi"
	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

func TestNeedsOwnership(t *testing.T) {
	gid := int64(2000)
	policy := func(p storagev1.FSGroupPolicy) *storagev1.CSIDriver {
		d := csitest.CSIDriver(drv, csitest.CSIDriverSpec{})
		d.Spec.FSGroupPolicy = &p
		return d
	}
	rwo := podvol.VolumeSpec{FSType: "ext4", AccessMode: "ReadWriteOnce"}
	tests := []struct {
		name   string
		spec   podvol.VolumeSpec
		vol    podvol.PodVolume
		caps   csi.Capabilities
		driver *storagev1.CSIDriver
		want   bool
	}{
		{name: "no fsGroup", spec: rwo},
		{name: "RWO with fsType, no CSIDriver", spec: rwo, vol: podvol.PodVolume{FSGroup: &gid}, want: true},
		{name: "default policy", spec: rwo, vol: podvol.PodVolume{FSGroup: &gid}, driver: csitest.CSIDriver(drv, csitest.CSIDriverSpec{}), want: true},
		{name: "driver applies it (VOLUME_MOUNT_GROUP)", spec: rwo, vol: podvol.PodVolume{FSGroup: &gid}, caps: csi.Capabilities{VolumeMountGroup: true}},
		{name: "read-only pod volume", spec: rwo, vol: podvol.PodVolume{FSGroup: &gid, ReadOnly: true}},
		{name: "read-only PV", spec: podvol.VolumeSpec{FSType: "ext4", AccessMode: "ReadWriteOnce", ReadOnly: true}, vol: podvol.PodVolume{FSGroup: &gid}},
		{name: "no fsType", spec: podvol.VolumeSpec{AccessMode: "ReadWriteOnce"}, vol: podvol.PodVolume{FSGroup: &gid}},
		{name: "RWX", spec: podvol.VolumeSpec{FSType: "ext4", AccessMode: "ReadWriteMany"}, vol: podvol.PodVolume{FSGroup: &gid}},
		{name: "RWX with File policy", spec: podvol.VolumeSpec{AccessMode: "ReadWriteMany"}, vol: podvol.PodVolume{FSGroup: &gid}, driver: policy(storagev1.FileFSGroupPolicy), want: true},
		{name: "None policy", spec: rwo, vol: podvol.PodVolume{FSGroup: &gid}, driver: policy(storagev1.NoneFSGroupPolicy)},
		{name: "RWO second of the PV's modes", spec: podvol.VolumeSpec{FSType: "ext4", AccessMode: "ReadOnlyMany", ReadWriteOnce: true}, vol: podvol.PodVolume{FSGroup: &gid}, want: true},
		{name: "PV without access modes", spec: podvol.VolumeSpec{FSType: "ext4"}, vol: podvol.PodVolume{FSGroup: &gid}},
		{name: "inline with fsType", spec: podvol.VolumeSpec{FSType: "ext4", Ephemeral: true}, vol: podvol.PodVolume{FSGroup: &gid}, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := needsOwnership(&tt.spec, tt.vol, tt.caps, tt.driver); got != tt.want {
				t.Errorf("needsOwnership = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestSetUpAppliesFSGroup: a driver without VOLUME_MOUNT_GROUP gets its
// published volume owned by nodevol; one with it gets the group in the
// request and nodevol leaves the files alone.
func TestSetUpAppliesFSGroup(t *testing.T) {
	gid := int64(os.Getgid())
	for _, mountGroup := range []bool{false, true} {
		e := newEnv(t, envOptions{
			objects: []runtime.Object{csitest.CSIDriver(drv, csitest.CSIDriverSpec{})},
			driver:  csitest.Options{NoStageUnstage: true, CreateTargetDirs: true, VolumeMountGroup: mountGroup},
		})
		vol := podVolume("a", "data")
		vol.FSGroup = &gid
		path, err := e.p.SetUp(context.Background(), volume.MountRequest{Spec: testSpec(drv), Volume: vol, ChangeOwnership: ownership(t, e)})
		if err != nil {
			t.Fatal(err)
		}
		info, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		mode := info.Mode()
		req := e.request(t, "NodePublishVolume").(*csipb.NodePublishVolumeRequest)
		passed := req.GetVolumeCapability().GetMount().GetVolumeMountGroup()
		if mountGroup {
			if mode&fs.ModeSetgid != 0 || passed == "" {
				t.Errorf("VOLUME_MOUNT_GROUP: mode %v (want untouched), volume_mount_group %q (want %d)", mode, passed, gid)
			}
		} else if mode&fs.ModeSetgid == 0 || mode.Perm()&0o770 != 0o770 || passed != "" {
			t.Errorf("no VOLUME_MOUNT_GROUP: mode %v (want setgid, group rwx), volume_mount_group %q (want none)", mode, passed)
		}
	}
}

// ownership is the planner's decision for a writable pod with an fsGroup:
// the capability.
func ownership(t *testing.T, e *env) bool {
	t.Helper()
	caps, err := e.p.Capabilities(testSpec(drv))
	if err != nil {
		t.Fatal(err)
	}
	return caps.OwnershipChange
}
