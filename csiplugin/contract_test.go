package csiplugin

import (
	"errors"
	"reflect"
	"testing"

	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// TestCapabilities: what the planner will read for a CSI volume, from the
// driver's node capabilities and its CSIDriver object.
func TestCapabilities(t *testing.T) {
	pv := &podvol.VolumeSpec{Name: podvol.CSIVolumeName(drv, "h"), Driver: drv, VolumeHandle: "h", FSType: "ext4", AccessMode: "ReadWriteOnce"}
	block := *pv
	block.Mode = podvol.Block
	persistent := []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent}
	both := []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent, storagev1.VolumeLifecycleEphemeral}
	inline := &podvol.VolumeSpec{Name: "kubernetes.io/csi/uid-data", Driver: drv, VolumeHandle: "csi-x", Ephemeral: true}
	tests := []struct {
		name    string
		driver  csitest.Options
		objects []runtime.Object
		spec    *podvol.VolumeSpec
		want    volume.Capabilities
	}{
		{"a PV, no CSIDriver: attached and staged", csitest.Options{}, nil, pv,
			volume.Capabilities{RepublishAtResyncOnly: true, Attachable: true, Stages: true, Block: true, OwnershipChange: true, LifecycleModes: persistent}},
		{"attachRequired false", csitest.Options{}, []runtime.Object{csitest.CSIDriver(drv, csitest.CSIDriverSpec{})}, pv,
			volume.Capabilities{RepublishAtResyncOnly: true, Stages: true, Block: true, OwnershipChange: true, LifecycleModes: persistent}},
		{"no STAGE_UNSTAGE_VOLUME", csitest.Options{NoStageUnstage: true}, nil, pv,
			volume.Capabilities{RepublishAtResyncOnly: true, Attachable: true, Block: true, OwnershipChange: true, LifecycleModes: persistent}},
		{"requiresRepublish, fsGroupPolicy None", csitest.Options{},
			[]runtime.Object{csiDriverFSGroupPolicy(csitest.CSIDriver(drv, csitest.CSIDriverSpec{
				AttachRequired:    true,
				RequiresRepublish: true,
			}), storagev1.NoneFSGroupPolicy)}, pv,
			volume.Capabilities{RepublishAtResyncOnly: true, Attachable: true, Stages: true, Block: true, Republish: true, LifecycleModes: persistent}},
		{"the driver applies fsGroup itself", csitest.Options{VolumeMountGroup: true}, nil, pv,
			volume.Capabilities{RepublishAtResyncOnly: true, Attachable: true, Stages: true, Block: true, LifecycleModes: persistent}},
		{"an inline volume, no CSIDriver: neither attached nor staged, no modes (the publish refuses it)", csitest.Options{}, nil, inline,
			volume.Capabilities{RepublishAtResyncOnly: true, Block: true}},
		{"a raw block volume is staged without STAGE_UNSTAGE_VOLUME (its map directories)", csitest.Options{NoStageUnstage: true}, nil, &block,
			volume.Capabilities{RepublishAtResyncOnly: true, Attachable: true, Stages: true, Block: true, OwnershipChange: true, LifecycleModes: persistent}},
		{"the CSIDriver's volumeLifecycleModes", csitest.Options{},
			[]runtime.Object{csitest.CSIDriver(drv, csitest.CSIDriverSpec{AttachRequired: true, LifecycleModes: both})}, inline,
			volume.Capabilities{RepublishAtResyncOnly: true, Block: true, LifecycleModes: both}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, envOptions{driver: tt.driver, objects: tt.objects})
			got, err := e.p.Capabilities(tt.spec)
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Capabilities = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
	e := newEnv(t, envOptions{})
	other := &podvol.VolumeSpec{Name: podvol.CSIVolumeName("other", "h"), Driver: "other", VolumeHandle: "h"}
	if _, err := e.p.Capabilities(other); !errors.Is(err, volume.ErrNotReady) {
		t.Errorf("Capabilities of a volume of a driver not registered = %v, want ErrNotReady", err)
	}
}

// csiDriverFSGroupPolicy sets d's fsGroupPolicy and returns d.
func csiDriverFSGroupPolicy(d *storagev1.CSIDriver, p storagev1.FSGroupPolicy) *storagev1.CSIDriver {
	d.Spec.FSGroupPolicy = &p
	return d
}
