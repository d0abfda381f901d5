package volumemanager

import (
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/ondisk"
)

// treeOf lists everything under dir with its type and content.
func treeOf(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		entry := rel + " " + d.Type().String()
		if d.Type().IsRegular() {
			data, _ := os.ReadFile(path)
			entry += " " + string(data)
		}
		out = append(out, entry)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// writeTree creates files (with content) and directories (a trailing "/")
// under dir.
func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if name[len(name)-1] == '/' {
			if err := os.MkdirAll(p, 0o750); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o640); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRestartIgnoresSymlinks: directories under the root that are
// symlinks to directories outside it, laid out like a pod's volume and a
// staged volume with valid vol_data.json files, are not reconstructed: after
// MarkPodsSynced nothing is unpublished or unstaged, and every file outside
// is still there.
func TestRestartIgnoresSymlinks(t *testing.T) {
	drv := csitest.New(t, csitest.Options{CreateTargetDirs: true})
	client := fake.NewClientset(csitest.CSIDriver(drv.DriverName(), csitest.CSIDriverSpec{}))
	root := t.TempDir()
	podVolData := `{"specVolID":"pv-x","volumeHandle":"handle-x","driverName":"` + drv.DriverName() +
		`","nodeName":"` + node + `","attachmentID":"csi-x","volumeLifecycleMode":"Persistent"}`
	stageData := `{"specVolID":"pv-y","volumeHandle":"handle-y","driverName":"` + drv.DriverName() + `"}`
	sum := sha256.Sum256([]byte("handle-y"))
	stagingName := hex.EncodeToString(sum[:])

	// pods/{uid} -> a pod directory outside the root.
	outPod := t.TempDir()
	writeTree(t, outPod, map[string]string{
		"volumes/kubernetes.io~csi/pv-x/vol_data.json": podVolData,
		"volumes/kubernetes.io~csi/pv-x/mount/":        "",
		"volumes/kubernetes.io~csi/pv-x/mount/data":    "precious",
	})
	// pods/{uid2}/volumes -> a volumes directory outside the root.
	outVolumes := t.TempDir()
	writeTree(t, outVolumes, map[string]string{
		"kubernetes.io~csi/pv-x/vol_data.json": podVolData,
		"kubernetes.io~csi/pv-x/mount/":        "",
	})
	// plugins/kubernetes.io/csi/{driver}/{sha256(handle)} -> a staging
	// directory outside the root.
	outStaging := t.TempDir()
	writeTree(t, outStaging, map[string]string{
		ondisk.VolumeDataFile: stageData,
		"globalmount/":        "",
	})
	// plugins/kubernetes.io/csi/{driver} -> a driver directory outside the root.
	outDriver := t.TempDir()
	writeTree(t, outDriver, map[string]string{
		stagingName + "/" + ondisk.VolumeDataFile: stageData,
		stagingName + "/globalmount/":             "",
	})
	links := map[string]string{
		filepath.Join(root, "pods", "uid-linked"):                                             outPod,
		filepath.Join(root, "pods", "uid-volumes", "volumes"):                                 outVolumes,
		filepath.Join(root, "plugins", "kubernetes.io", "csi", "other.example.com"):           outDriver,
		filepath.Join(root, "plugins", "kubernetes.io", "csi", drv.DriverName(), stagingName): outStaging,
	}
	before := map[string][]string{}
	for link, target := range links {
		if err := os.MkdirAll(filepath.Dir(link), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
		before[target] = treeOf(t, target)
	}
	// The driver directory link carries another driver's name: make its
	// vol_data.json match, so that only the symlink keeps it out.
	writeTree(t, outDriver, map[string]string{
		stagingName + "/" + ondisk.VolumeDataFile: `{"specVolID":"pv-y","volumeHandle":"handle-y","driverName":"other.example.com"}`,
	})
	before[outDriver] = treeOf(t, outDriver)

	vm, stop := startVM(t, client, root, drv)
	defer stop()
	for _, uid := range []types.UID{"uid-linked", "uid-volumes"} {
		if vm.HasPossiblyMountedVolumesForPod(uid) {
			t.Errorf("pod %s, a symlink under the root, was reconstructed", uid)
		}
	}
	if got := knownVolumes(vm); len(got) != 0 {
		t.Errorf("volumes in use %v, want none: nothing under the root is real", got)
	}
	vm.MarkPodsSynced()
	waitIdle(t, vm)
	for _, m := range []string{"NodeUnpublishVolume", "NodeUnstageVolume"} {
		if n := drv.Calls(m); n != 0 {
			t.Errorf("%d %s calls for volumes found through symlinks", n, m)
		}
	}
	for link, target := range links {
		if after := treeOf(t, target); !slices.Equal(after, before[target]) {
			t.Errorf("%s (the target of %s) changed:\nbefore %q\nafter  %q", target, link, before[target], after)
		}
		if fi, err := os.Lstat(link); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			t.Errorf("the symlink %s is gone or replaced: %v", link, err)
		}
	}
}
