package emptydir

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/step"
)

// TestSetUpHoldsTheRoot: a set-up resolves all its paths from the root
// directory as it was when it started: when another directory takes the
// root's path after its first change, the volume's directory and its
// ready file still go to the directory it started with, none of it to the
// new one.
func TestSetUpHoldsTheRoot(t *testing.T) {
	tp := newTestPlugin(t, nil)
	old := tp.root + ".old"
	var once sync.Once
	tp.rfs = tp.rfs.WithSteps(func(step.Step) error {
		var err error
		once.Do(func() {
			if err = os.Rename(tp.root, old); err == nil {
				err = os.Mkdir(tp.root, 0o750)
			}
		})
		return err
	})
	if _, err := tp.SetUp(context.Background(), request(tp.spec(t, testPod(), "scratch", v1.EmptyDirVolumeSource{}), "scratch")); err != nil {
		t.Fatalf("SetUp: %v", err)
	}
	if entries, err := os.ReadDir(tp.root); err != nil || len(entries) != 0 {
		t.Errorf("the new root holds %v (%v), want nothing", entries, err)
	}
	for _, p := range []string{tp.volumeDir("scratch"), tp.readyPath("scratch")} {
		rel := strings.TrimPrefix(p, tp.root)
		if _, err := os.Stat(filepath.Join(old, rel)); err != nil {
			t.Errorf("%s is not in the root the set-up started with: %v", rel, err)
		}
	}
}
