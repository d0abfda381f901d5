package subpath

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/step"
)

// TestCleanVolumeHoldsTheRoot: a clean-up resolves all its paths from the
// root directory as it was when it started: when another directory takes
// the root's path after its first removal, the rest of the directories
// still go from the directory it started with.
func TestCleanVolumeHoldsTheRoot(t *testing.T) {
	root := filepath.Join(t.TempDir(), "kubelet")
	old := root + ".old"
	var once sync.Once
	m, err := New(Config{RootDir: root, Mounter: mount.NewFakeMounter(nil), Steps: func(step.Step) error {
		var err error
		once.Do(func() {
			if err = os.Rename(root, old); err == nil {
				err = os.Mkdir(root, 0o750)
			}
		})
		return err
	}})
	if err != nil {
		t.Fatal(err)
	}
	mkdirs(t, filepath.Join(root, "pods/uid/volume-subpaths/vol/ctr"))
	if err := m.CleanVolume(context.Background(), "uid", "vol"); err != nil {
		t.Fatal(err)
	}
	if got := tree(t, old); len(got) != 2 || got[0] != "pods" || got[1] != "pods/uid" {
		t.Errorf("the root the clean-up started with holds %q, want only pods/uid", got)
	}
	if entries, err := os.ReadDir(root); err != nil || len(entries) != 0 {
		t.Errorf("the new root holds %v (%v), want nothing", entries, err)
	}
}
