package volumemanager

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/nodevol/nodevol/csiplugin"
)

// TestReconstructRemovesWriteLeftovers: the temporary file of a
// vol_data.json write cut short by a crash, in a pod volume directory or a
// staging directory, is removed when the volume is reconstructed (the
// kubelet's teardown rmdirs these directories after a hand-over, and fails
// on a file it does not know); the volumes are found as before and nothing
// else is touched.
func TestReconstructRemovesWriteLeftovers(t *testing.T) {
	root := t.TempDir()
	podDir := plantPodVolume(t, root, "uid-a", "pv", nil)
	stageDir := filepath.Join(root, "plugins", "kubernetes.io", "csi", "d.example.com", "0123abcd")
	plantFile(t, filepath.Join(stageDir, csiplugin.VolumeDataFile), `{"specVolID":"pv","volumeHandle":"h-pv","driverName":"d.example.com"}`)
	if err := os.MkdirAll(filepath.Join(stageDir, "globalmount"), 0o750); err != nil {
		t.Fatal(err)
	}
	leftovers := []string{
		filepath.Join(podDir, ".vol_data.json.tmp-0a1b2c3d4e5f"),
		filepath.Join(stageDir, ".vol_data.json.tmp-5f4e3d2c1b0a"),
	}
	kept := []string{filepath.Join(podDir, "mount", ".vol_data.json.tmp-data"), filepath.Join(podDir, csiplugin.VolumeDataFile)}
	for _, p := range append(leftovers, kept...) {
		if _, err := os.Stat(p); err != nil {
			plantFile(t, p, "{")
		}
	}
	rc := recovery{bootID: "boot-1", mountPoints: map[string]bool{filepath.Join(podDir, "mount"): true, filepath.Join(stageDir, "globalmount"): true}}
	got := reconstruct(context.Background(), root, rc)
	if len(got.mounts) != 1 {
		t.Errorf("pod volumes found: %+v, want the one", got.mounts)
	}
	for _, p := range leftovers {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: %v, want removed", p, err)
		}
	}
	for _, p := range kept {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("%s: %v, want it kept", p, err)
		}
	}
}
