package ondisk

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/nodevol/nodevol/internal/rootfs"
)

// TestFindStagingDir: the legacy directory when an older kubelet staged
// this very volume there, the hashed one otherwise; an invalid driver name
// is an error, a symlink on the legacy path too.
func TestFindStagingDir(t *testing.T) {
	const drv, handle = "csi.example.com", "vol-1"
	for _, tc := range []struct {
		name       string
		pv, driver string
		legacy     func(t *testing.T, r *rootfs.Root, dir string) // what an older kubelet left, if anything
		wantLegacy bool
		wantErr    bool
	}{
		{name: "nothing staged", pv: "pv-1", driver: drv},
		{name: "no PV", driver: drv},
		{name: "legacy staging of this volume", pv: "pv-1", driver: drv, wantLegacy: true,
			legacy: func(t *testing.T, r *rootfs.Root, dir string) { stageLegacy(t, r, dir, drv, handle) }},
		{name: "legacy staging of another volume", pv: "pv-1", driver: drv,
			legacy: func(t *testing.T, r *rootfs.Root, dir string) { stageLegacy(t, r, dir, drv, "vol-2") }},
		{name: "legacy path through a symlink", pv: "pv-1", driver: drv, wantErr: true,
			legacy: func(t *testing.T, _ *rootfs.Root, dir string) {
				if err := os.MkdirAll(filepath.Dir(dir), 0o750); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(t.TempDir(), dir); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "invalid driver name", pv: "pv-1", driver: "a/b", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			r, err := rootfs.New(root)
			if err != nil {
				t.Fatal(err)
			}
			legacyDir := filepath.Join(root, pluginDir, legacyPVDir, "pv-1")
			if tc.legacy != nil {
				tc.legacy(t, r, legacyDir)
			}
			dir, legacy, err := FindStagingDir(r, root, tc.pv, tc.driver, handle)
			if (err != nil) != tc.wantErr {
				t.Fatalf("FindStagingDir = %q, %v, %v; want an error: %v", dir, legacy, err, tc.wantErr)
			}
			if tc.wantErr {
				return
			}
			want, _ := StagingDir(root, tc.driver, handle)
			if tc.wantLegacy {
				want = legacyDir
			}
			if dir != want || legacy != tc.wantLegacy {
				t.Errorf("FindStagingDir = %q, %v; want %q, %v", dir, legacy, want, tc.wantLegacy)
			}
		})
	}
}

// stageLegacy leaves what an older kubelet leaves in a legacy staging
// directory: globalmount and vol_data.json naming the volume.
func stageLegacy(t *testing.T, r *rootfs.Root, dir, driver, handle string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, StagingLeaf), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := WriteVolumeData(r, dir, &VolumeData{DriverName: driver, VolumeHandle: handle}); err != nil {
		t.Fatal(err)
	}
}
