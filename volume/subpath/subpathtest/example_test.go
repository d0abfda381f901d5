package subpathtest_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/nodevol/nodevol/volume/subpath"
	"github.com/nodevol/nodevol/volume/subpath/subpathtest"
)

// A unit test of code that prepares subPaths, with no root and no real
// mount: the fake records what Prepare bound, here the directory the
// volume's symlink current leads to.
func Example() {
	dir, err := os.MkdirTemp("", "subpath-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	vol := filepath.Join(dir, "vol")
	if err := os.MkdirAll(filepath.Join(vol, "v2"), 0o755); err != nil {
		log.Fatal(err)
	}
	if err := os.Symlink("v2", filepath.Join(vol, "current")); err != nil {
		log.Fatal(err)
	}
	fake := subpathtest.NewMounter(nil)
	m, err := subpath.New(subpath.Config{RootDir: filepath.Join(dir, "root"), Mounter: fake})
	if err != nil {
		log.Fatal(err)
	}
	target, err := m.Prepare(context.Background(), subpath.Mount{
		Pod: "uid-1", Volume: "data", VolumePath: vol, Container: "app", Index: 0, SubPath: "current",
	})
	if err != nil {
		log.Fatal(err)
	}
	b, _ := fake.Bound(target)
	rel, _ := filepath.Rel(dir, target)
	fmt.Println("target:", rel)
	fmt.Println("bound:", b.File == filepath.Join(vol, "v2"), b.Flags)
	if err := m.CleanPod(context.Background(), "uid-1"); err != nil {
		log.Fatal(err)
	}
	_, bound := fake.Bound(target)
	fmt.Println("bound after CleanPod:", bound)
	// Output:
	// target: root/pods/uid-1/volume-subpaths/data/app/0
	// bound: true [--no-canonicalize]
	// bound after CleanPod: false
}
