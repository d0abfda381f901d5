package csiplugin

import (
	"context"
	"testing"

	"github.com/nodevol/nodevol/csi"
	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/volume"
)

// TestVolumeCondition: the VOLUME_CONDITION capability and the condition in
// NodeGetVolumeStats, as a CSI 1.12 driver sends them, reach VolumeStats;
// a driver without the capability reports no condition.
func TestVolumeCondition(t *testing.T) {
	for _, tc := range []struct {
		name string
		caps bool
		set  *csitest.VolumeCondition
		want *volume.Condition
	}{
		{name: "no capability", caps: false, set: &csitest.VolumeCondition{Abnormal: true, Message: "x"}},
		{name: "normal by default", caps: true, want: &volume.Condition{}},
		{name: "abnormal", caps: true, set: &csitest.VolumeCondition{Abnormal: true, Message: "I/O errors"}, want: &volume.Condition{Abnormal: true, Message: "I/O errors"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{driver: csitest.Options{CreateTargetDirs: true, GetVolumeStats: true, VolumeCondition: tc.caps}})
			if got := mustClient(t, e.reg, drv).Capabilities().VolumeCondition; got != tc.caps {
				t.Errorf("Capabilities().VolumeCondition = %v, want %v", got, tc.caps)
			}
			spec := testSpec(drv)
			ctx := context.Background()
			staging, err := e.p.MountDevice(ctx, volume.DeviceRequest{Spec: spec})
			if err != nil {
				t.Fatal(err)
			}
			target, err := e.p.SetUp(ctx, volume.MountRequest{Spec: spec, Volume: podVolume("a", "data"), DeviceMountPath: staging})
			if err != nil {
				t.Fatal(err)
			}
			if tc.set != nil {
				e.srv.SetVolumeCondition("vol-1", *tc.set)
			}
			s, ok, err := e.p.VolumeStats(ctx, spec, target, staging)
			if err != nil || !ok {
				t.Fatalf("VolumeStats: %v, %v", ok, err)
			}
			if (s.Condition == nil) != (tc.want == nil) || (s.Condition != nil && *s.Condition != *tc.want) {
				t.Errorf("condition %+v, want %+v", s.Condition, tc.want)
			}
			if s.CapacityBytes != csitest.DefaultCapacity {
				t.Errorf("capacity %d, want %d", s.CapacityBytes, csitest.DefaultCapacity)
			}
		})
	}
}

func mustClient(t *testing.T, r *csi.Registry, driver string) *csi.Client {
	t.Helper()
	c, err := r.Client(driver)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
