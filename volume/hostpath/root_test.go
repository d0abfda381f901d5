package hostpath

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/internal/blockdev"
	"github.com/nodevol/nodevol/internal/roottest"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// TestRootBlockDevice: a BlockDevice hostPath on a real loop device, named
// directly and through a symlink, is set up as its host path; a
// CharDevice one on it fails with what it is. (Nothing is mounted for a
// hostPath: the plugin has no mounter.)
func TestRootBlockDevice(t *testing.T) {
	roottest.Require(t)
	ctx := context.Background()
	dir := t.TempDir()
	backing := filepath.Join(dir, "disk.img")
	mustDo(t, os.WriteFile(backing, make([]byte, 1<<20), 0o600))
	loop := blockdev.NewLosetup(nil)
	dev, err := loop.Attach(ctx, backing)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := loop.Detach(context.Background(), dev); err != nil {
			t.Errorf("detaching %s: %v", dev, err)
		}
	})
	link := filepath.Join(dir, "disk")
	mustDo(t, os.Symlink(dev, link))

	p := newPlugin(t, nil)
	ref := podvol.PodRef{UID: "uid-1", Namespace: "ns", Name: "web"}
	for _, path := range []string{dev, link} {
		req := volume.MountRequest{Spec: podSpec("disk", hostPathSource(path, v1.HostPathBlockDev)), Volume: podvol.PodVolume{Pod: ref, SpecName: "disk"}}
		if got, err := p.SetUp(ctx, req); err != nil || got != path {
			t.Errorf("SetUp(BlockDevice %s) = %q, %v; want the path", path, got, err)
		}
		if err := p.TearDown(ctx, req); err != nil {
			t.Errorf("TearDown = %v", err)
		}
	}
	req := volume.MountRequest{Spec: podSpec("disk", hostPathSource(dev, v1.HostPathCharDev)), Volume: podvol.PodVolume{Pod: ref, SpecName: "disk"}}
	want := `setting up hostPath volume "disk" of pod ns/web (type CharDevice): hostPath type check failed: ` + dev + ` is not a character device, it's a BlockDevice`
	if _, err := p.SetUp(ctx, req); err == nil || err.Error() != want {
		t.Errorf("SetUp(CharDevice %s) = %v, want %s", dev, err, want)
	}
}
