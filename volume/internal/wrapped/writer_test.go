package wrapped

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/internal/atomicwriter"
	"github.com/nodevol/nodevol/step"
	"github.com/nodevol/nodevol/volume/internal/emptydir"
)

// TestWriterHoldsTheRoot: a Writer resolves every name from the root
// directory as it was when Writer was called: when another directory
// takes the root's path after the first change of the Write, every file
// still goes to the directory it started with, none to the new one.
func TestWriterHoldsTheRoot(t *testing.T) {
	root := filepath.Join(t.TempDir(), "kubelet")
	old := root + ".old"
	var once sync.Once
	b, err := New("test", "example.com/test", emptydir.Config{RootDir: root, Mounter: mount.NewFakeMounter(nil),
		Steps: func(step.Step) error {
			var err error
			once.Do(func() {
				if err = os.Rename(root, old); err == nil {
					err = os.Mkdir(root, 0o750)
				}
			})
			return err
		}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	const dir = "pods/uid/volumes/example.com~test/v"
	if err := os.MkdirAll(filepath.Join(root, dir), 0o750); err != nil {
		t.Fatal(err)
	}
	w, release, err := b.Writer(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if _, err := w.Write(context.Background(), map[string]atomicwriter.File{"a": {Data: []byte("1"), Mode: 0o644}, "b/c": {Data: []byte("2"), Mode: 0o644}}); err != nil {
		t.Fatalf("Write: %v", err)
	}
	if entries, err := os.ReadDir(root); err != nil || len(entries) != 0 {
		t.Errorf("the new root holds %v (%v), want nothing", entries, err)
	}
	for _, name := range []string{"a", "b/c"} {
		if _, err := os.Stat(filepath.Join(old, dir, name)); err != nil {
			t.Errorf("%s is not in the root the Writer started with: %v", name, err)
		}
	}
}
