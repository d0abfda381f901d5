package csiplugin

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/volume"
)

// TestLegacyStagingPath: a volume an older kubelet staged under
// plugins/kubernetes.io/csi/pv/{pvName}/globalmount is staged, published
// and unstaged there (its vol_data.json read, never rewritten), and its
// directory removed; a legacy directory of another volume, or without
// vol_data.json, is left alone and the volume staged at the hashed path; a
// symlink on the legacy path fails the stage before any call.
func TestLegacyStagingPath(t *testing.T) {
	const oldData = `{"driverName":"` + drv + `","volumeHandle":"vol-1"}`
	hashed := func(root string) string {
		return filepath.Join(root, "plugins/kubernetes.io/csi", drv, sha256Hex("vol-1"))
	}
	for _, tc := range []struct {
		name string
		// prepare lays out what an older kubelet left under root.
		prepare func(t *testing.T, root string)
		// legacy: the volume is staged in the legacy directory.
		legacy bool
		// wantErr, if set, is in MountDevice's error, and no call is made.
		wantErr string
	}{
		{
			name:    "staged by an older kubelet",
			prepare: func(t *testing.T, root string) { writeLegacy(t, root, "pv-1", oldData) },
			legacy:  true,
		},
		{
			name: "legacy directory of another volume",
			prepare: func(t *testing.T, root string) {
				writeLegacy(t, root, "pv-1", `{"driverName":"`+drv+`","volumeHandle":"vol-other"}`)
			},
		},
		{
			name:    "legacy directory without vol_data.json",
			prepare: func(t *testing.T, root string) { writeLegacy(t, root, "pv-1", "") },
		},
		{
			name:    "no legacy directory",
			prepare: func(*testing.T, string) {},
		},
		{
			name: "legacy pv directory is a symlink",
			prepare: func(t *testing.T, root string) {
				elsewhere := t.TempDir()
				writeLegacy(t, elsewhere, "pv-1", oldData)
				mkdir(t, filepath.Join(root, "plugins/kubernetes.io/csi"))
				if err := os.Symlink(filepath.Join(elsewhere, "plugins/kubernetes.io/csi/pv"), filepath.Join(root, "plugins/kubernetes.io/csi/pv")); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: "symlinks under the root are not followed",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{driver: csitest.Options{CreateTargetDirs: true}})
			tc.prepare(t, e.root)
			legacyDir := filepath.Join(e.root, "plugins/kubernetes.io/csi/pv/pv-1")
			before, _ := os.ReadFile(filepath.Join(legacyDir, ondisk.VolumeDataFile))
			spec := testSpec(drv)
			ctx := context.Background()

			stagingPath, err := e.p.MountDevice(ctx, volume.DeviceRequest{Spec: spec})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("MountDevice error = %v, want one containing %q", err, tc.wantErr)
				}
				if n := e.srv.Calls("NodeStageVolume"); n != 0 {
					t.Errorf("the driver got %d NodeStageVolume calls", n)
				}
				assertGone(t, hashed(e.root))
				return
			}
			if err != nil {
				t.Fatalf("MountDevice: %v", err)
			}
			wantDir := hashed(e.root)
			if tc.legacy {
				wantDir = legacyDir
			}
			wantPath := filepath.Join(wantDir, "globalmount")
			if stagingPath != wantPath {
				t.Errorf("MountDevice returned %s, want %s", stagingPath, wantPath)
			}
			if got := e.request(t, "NodeStageVolume").(*csipb.NodeStageVolumeRequest).GetStagingTargetPath(); got != wantPath {
				t.Errorf("NodeStageVolume staging_target_path = %s, want %s", got, wantPath)
			}
			if tc.legacy {
				assertGone(t, hashed(e.root))
			}
			// Publish without the path from MountDevice (as after a
			// restart) finds the same staging path.
			vol := podVolume("a", "data")
			if _, err := e.p.SetUp(ctx, volume.MountRequest{Spec: spec, Volume: vol}); err != nil {
				t.Fatalf("SetUp: %v", err)
			}
			if got := e.request(t, "NodePublishVolume").(*csipb.NodePublishVolumeRequest).GetStagingTargetPath(); got != wantPath {
				t.Errorf("NodePublishVolume staging_target_path = %s, want %s", got, wantPath)
			}
			if err := e.p.TearDown(ctx, volume.MountRequest{Spec: spec, Volume: vol}); err != nil {
				t.Fatalf("TearDown: %v", err)
			}
			if tc.legacy {
				// Read, never written.
				if after, _ := os.ReadFile(filepath.Join(legacyDir, ondisk.VolumeDataFile)); string(after) != string(before) {
					t.Errorf("legacy vol_data.json = %s, want it unchanged: %s", after, before)
				}
			}
			if err := e.p.UnmountDevice(ctx, volume.DeviceRequest{Spec: spec}); err != nil {
				t.Fatalf("UnmountDevice: %v", err)
			}
			if got := e.request(t, "NodeUnstageVolume").(*csipb.NodeUnstageVolumeRequest).GetStagingTargetPath(); got != wantPath {
				t.Errorf("NodeUnstageVolume staging_target_path = %s, want %s", got, wantPath)
			}
			assertGone(t, wantDir)
			if tc.legacy {
				// The parent of all legacy directories stays, as the kubelet leaves it.
				if fi, err := os.Lstat(filepath.Dir(legacyDir)); err != nil || !fi.IsDir() {
					t.Errorf("%s: %v, want the directory kept", filepath.Dir(legacyDir), err)
				}
			} else if before != nil || tc.name == "legacy directory without vol_data.json" {
				// Another volume's legacy directory is left as it was.
				if _, err := os.Stat(filepath.Join(legacyDir, "globalmount")); err != nil {
					t.Errorf("legacy directory of another volume touched: %v", err)
				}
			}
		})
	}
}

// writeLegacy lays out a legacy staging directory as an older kubelet
// left it: pv/{pvName}/globalmount and, unless data is "", vol_data.json.
func writeLegacy(t *testing.T, root, pvName, data string) {
	t.Helper()
	dir := filepath.Join(root, "plugins/kubernetes.io/csi/pv", pvName)
	mkdir(t, filepath.Join(dir, "globalmount"))
	if data != "" {
		if err := os.WriteFile(filepath.Join(dir, ondisk.VolumeDataFile), []byte(data), 0o640); err != nil {
			t.Fatal(err)
		}
	}
}

func mkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
}
