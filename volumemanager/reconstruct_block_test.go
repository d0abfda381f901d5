package volumemanager

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/podvol"
)

// TestReconstructBlockPublishes: a raw block volume published for a pod
// whose symlink is gone is found from its publish path, or from the record
// of one, once per pod however it is found, as an Uncertain pod mount with
// its device; a symlink in the way is not followed, and a record of
// another boot whose publish path is gone stands for nothing.
func TestReconstructBlockPublishes(t *testing.T) {
	const spec = "pv-raw"
	publishRel := func(uid string) string {
		return filepath.Join("plugins/kubernetes.io/csi/volumeDevices/publish", spec, uid)
	}
	plantData := func(t *testing.T, root string) {
		plantFile(t, filepath.Join(root, "plugins/kubernetes.io/csi/volumeDevices", spec, "data", ondisk.VolumeDataFile),
			`{"specVolID":"`+spec+`","volumeHandle":"h-raw","driverName":"d.example.com","volumeLifecycleMode":"Persistent"}`)
	}
	plantRecord := func(t *testing.T, root, uid, boot string, phase ...ondisk.Phase) {
		rel := publishRel(uid)
		ph := ondisk.PhasePublishing
		if len(phase) > 0 {
			ph = phase[0]
		}
		b, _ := json.Marshal(ondisk.Record{Version: 1, BootID: boot, Phase: ph, Dir: rel,
			Driver: "d.example.com", VolumeHandle: "h-raw", PVName: spec, PodUID: uid, SpecName: spec, Mode: "Block"})
		plantFile(t, filepath.Join(root, ondisk.RecordFile(rel)), string(b))
	}
	for _, tc := range []struct {
		name     string
		plant    func(t *testing.T, root string)
		wantPods []string
		wantGone string // a record file that must have been removed
		wantKept string // a record file that must still be there
	}{
		{"publish path, no symlink", func(t *testing.T, root string) {
			plantData(t, root)
			plantFile(t, filepath.Join(root, publishRel("uid-a")), "")
		}, []string{"uid-a"}, "", ""},
		{"publish path and symlink: found once", func(t *testing.T, root string) {
			plantData(t, root)
			plantFile(t, filepath.Join(root, publishRel("uid-a")), "")
			link := filepath.Join(root, "pods/uid-a/volumeDevices/kubernetes.io~csi", spec)
			if err := os.MkdirAll(filepath.Dir(link), 0o750); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(filepath.Join(root, publishRel("uid-a")), link); err != nil {
				t.Fatal(err)
			}
		}, []string{"uid-a"}, "", ""},
		{"record only, this boot", func(t *testing.T, root string) {
			plantData(t, root)
			plantRecord(t, root, "uid-b", "boot-1")
		}, []string{"uid-b"}, "", ondisk.RecordFile(publishRel("uid-b"))},
		{"record only, vol_data.json gone", func(t *testing.T, root string) {
			plantRecord(t, root, "uid-b", "boot-1")
		}, []string{"uid-b"}, "", ondisk.RecordFile(publishRel("uid-b"))},
		// A completed publish whose target is gone was undone since (the
		// kubelet's teardown after a hand-over leaves nodevol's records).
		{"record only, publish done", func(t *testing.T, root string) {
			plantData(t, root)
			plantRecord(t, root, "uid-b", "boot-1", ondisk.PhasePublished)
		}, nil, ondisk.RecordFile(publishRel("uid-b")), ""},
		{"record only, earlier boot", func(t *testing.T, root string) {
			plantData(t, root)
			plantRecord(t, root, "uid-b", "boot-0")
		}, nil, ondisk.RecordFile(publishRel("uid-b")), ""},
		{"publish directory is a symlink", func(t *testing.T, root string) {
			plantData(t, root)
			elsewhere := t.TempDir()
			plantFile(t, filepath.Join(elsewhere, "uid-a"), "")
			dir := filepath.Join(root, "plugins/kubernetes.io/csi/volumeDevices/publish")
			if err := os.MkdirAll(dir, 0o750); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(elsewhere, filepath.Join(dir, spec)); err != nil {
				t.Fatal(err)
			}
		}, nil, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			tc.plant(t, root)
			got := reconstruct(context.Background(), root, recovery{BootID: "boot-1", MountPoints: map[string]bool{}})
			var pods []string
			for _, m := range got.Mounts {
				if m.State != podvol.Uncertain || m.Spec.Mode != podvol.Block || m.Spec.VolumeHandle != "h-raw" || m.Spec.PVName != spec {
					t.Errorf("found %+v, want an Uncertain block mount of %s", m, spec)
				}
				pods = append(pods, string(m.Volume.Pod.UID))
			}
			if len(pods) != len(tc.wantPods) || len(pods) > 0 && pods[0] != tc.wantPods[0] {
				t.Errorf("found pod mounts of %v, want %v", pods, tc.wantPods)
			}
			if len(tc.wantPods) > 0 && (len(got.Devices) != 1 || got.Devices[0].Spec.Name != podvol.CSIVolumeName("d.example.com", "h-raw")) {
				t.Errorf("found devices %+v, want the volume's", got.Devices)
			}
			if tc.wantGone != "" {
				if _, err := os.Lstat(filepath.Join(root, tc.wantGone)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("record %s: %v, want removed", tc.wantGone, err)
				}
			}
			if tc.wantKept != "" {
				if _, err := os.Lstat(filepath.Join(root, tc.wantKept)); err != nil {
					t.Errorf("record %s: %v, want kept until the unpublish", tc.wantKept, err)
				}
			}
		})
	}
}
