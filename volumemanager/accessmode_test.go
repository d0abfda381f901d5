package volumemanager

import (
	"context"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// TestInlineVolumeAccessMode: an inline CSI volume reaches the driver as
// ReadWriteOnce, mapped as for any PV (the kubelet's csiMountMgr.SetUpAt
// starts from ReadWriteOnce), not with an unknown access mode.
func TestInlineVolumeAccessMode(t *testing.T) {
	for _, snmw := range []bool{false, true} {
		e := newEnv(t, envOptions{driver: csitest.Options{NoStageUnstage: true, SingleNodeMultiWriter: snmw}})
		drv := csitest.CSIDriver(e.drv.DriverName(), csitest.CSIDriverSpec{LifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecycleEphemeral}})
		if _, err := e.client.StorageV1().CSIDrivers().Update(context.Background(), drv, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod := csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{
			{Name: "scratch", Source: v1.VolumeSource{CSI: &v1.CSIVolumeSource{Driver: e.drv.DriverName()}}},
		}})
		if err := e.mount(pod, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		mode := csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
		if snmw {
			mode = csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER
		}
		want := &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
		}
		var got *csi.VolumeCapability
		for _, r := range e.drv.Requests() {
			if r.Method == "NodePublishVolume" {
				got = r.Req.(*csi.NodePublishVolumeRequest).GetVolumeCapability()
			}
		}
		if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
			t.Errorf("SNMW=%v: NodePublishVolume volume_capability (-want +got):\n%s", snmw, diff)
		}
	}
}
