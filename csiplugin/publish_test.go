package csiplugin

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// TestPublishChecksNamesFirst: the names of a publish that become paths are
// checked once, at SetUp's entry, before the driver is looked up: a bad
// name is a final error even for a driver that is not registered (not an
// ErrNotReady wait), for a file-system and a raw block volume alike, and
// nothing reaches the driver or the disk.
func TestPublishChecksNamesFirst(t *testing.T) {
	for _, tc := range []struct {
		name string
		mk   func() (*podvol.VolumeSpec, podvol.PodVolume)
		want string
	}{
		{"driver", func() (*podvol.VolumeSpec, podvol.PodVolume) { return testSpec("a/b"), podVolume("a", "data") }, "invalid driver name"},
		{"pod UID", func() (*podvol.VolumeSpec, podvol.PodVolume) {
			v := podVolume("a", "data")
			v.Pod.UID = types.UID("..")
			return testSpec(drv), v
		}, "invalid pod UID"},
		{"PV name", func() (*podvol.VolumeSpec, podvol.PodVolume) {
			s := testSpec(drv)
			s.PVName = "../x"
			return s, podVolume("a", "data")
		}, "invalid spec name"},
		{"block PV name", func() (*podvol.VolumeSpec, podvol.PodVolume) {
			s := blockSpec()
			s.PVName = "../x"
			return s, podVolume("a", "data")
		}, "invalid"},
		{"block pod UID", func() (*podvol.VolumeSpec, podvol.PodVolume) {
			v := podVolume("a", "data")
			v.Pod.UID = types.UID("a/b")
			return blockSpec(), v
		}, "invalid"},
		{"block without a PV", func() (*podvol.VolumeSpec, podvol.PodVolume) {
			s := blockSpec()
			s.PVName = ""
			return s, podVolume("a", "data")
		}, "needs a PersistentVolume"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{driver: csitest.Options{CreateTargetDirs: true}})
			e.p.blockMapper = &fakeBlockMapper{}
			spec, vol := tc.mk()
			spec.Driver = strings.Replace(spec.Driver, drv, "not-registered.example.com", 1)
			_, err := e.p.SetUp(context.Background(), volume.MountRequest{Spec: spec, Volume: vol})
			if err == nil || !strings.Contains(err.Error(), tc.want) || errors.Is(err, volume.ErrNotReady) || volume.IsUncertain(err) {
				t.Fatalf("SetUp = %v, want a final error with %q", err, tc.want)
			}
			if n := e.srv.Calls("NodePublishVolume"); n != 0 {
				t.Errorf("NodePublishVolume called %d times", n)
			}
			assertGone(t, filepath.Join(e.root, "pods"), filepath.Join(e.root, "plugins"))
		})
	}
}
