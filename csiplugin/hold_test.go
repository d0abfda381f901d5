package csiplugin

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/step"
	"github.com/nodevol/nodevol/volume"
)

// TestOperationHoldsTheRoot: a stage and a publish resolve all their
// paths from the root directory as it was when they started: when another
// directory takes the root's path after their first change, everything
// they write (directories, vol_data.json, records) still goes to the
// directory they started with, none of it to the new one.
func TestOperationHoldsTheRoot(t *testing.T) {
	for _, tc := range []struct {
		name string
		op   func(e *env) (string, error)
		dir  func(e *env) string // the volume directory, under e.root
	}{
		{"stage", func(e *env) (string, error) {
			return e.p.MountDevice(context.Background(), volume.DeviceRequest{Spec: testSpec(drv)})
		}, func(e *env) string { return filepath.Join("plugins/kubernetes.io/csi", drv, sha256Hex("vol-1")) }},
		{"publish", func(e *env) (string, error) {
			return e.p.SetUp(context.Background(), volume.MountRequest{Spec: testSpec(drv), Volume: podVolume("a", "data")})
		}, func(e *env) string { return "pods/uid-a/volumes/kubernetes.io~csi/pv-1" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{})
			if err := os.MkdirAll(e.root, 0o750); err != nil {
				t.Fatal(err)
			}
			if tc.name == "publish" { // the driver publishes only what it staged
				if _, err := e.p.MountDevice(context.Background(), volume.DeviceRequest{Spec: testSpec(drv)}); err != nil {
					t.Fatal(err)
				}
			}
			old := e.root + ".old"
			var once sync.Once
			e.p.rfs = e.p.rfs.WithSteps(func(s step.Step) error {
				var err error
				once.Do(func() {
					if err = os.Rename(e.root, old); err == nil {
						err = os.Mkdir(e.root, 0o750)
					}
				})
				return err
			})
			if _, err := tc.op(e); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			// (The staged volume of the publish case moved with the old root.)
			if entries, err := os.ReadDir(e.root); err != nil || len(entries) != 0 {
				t.Errorf("the new root holds %v (%v), want nothing", entries, err)
			}
			dir := tc.dir(e)
			for _, p := range []string{filepath.Join(dir, ondisk.VolumeDataFile), ondisk.RecordFile(dir)} {
				if _, err := os.Stat(filepath.Join(old, p)); err != nil {
					t.Errorf("%s is not in the root the operation started with: %v", p, err)
				}
			}
		})
	}
}
