package emptydir

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/internal/roottest"
	"github.com/nodevol/nodevol/podvol"
)

// BenchmarkRootSetUpTearDown sets up and tears down one emptyDir volume,
// on disk and in memory, with real mounts, on a node with 0 and 2,000
// other mounts (tmpfs, as a node's secret and token volumes are): what a
// volume costs as the node's mount table grows. Root only.
func BenchmarkRootSetUpTearDown(b *testing.B) {
	roottest.Require(b)
	for _, others := range []int{0, 2000} {
		for _, medium := range []v1.StorageMedium{"", v1.StorageMediumMemory} {
			name := fmt.Sprintf("mounts=%d/medium=%s", others, map[v1.StorageMedium]string{"": "disk", v1.StorageMediumMemory: "memory"}[medium])
			b.Run(name, func(b *testing.B) {
				mountOthers(b, others)
				p, err := newPlugin(Config{RootDir: b.TempDir(), Mounter: mount.New(""), AllocatableMemory: func() (int64, error) { return 8 << 30, nil }})
				if err != nil {
					b.Fatal(err)
				}
				spec := &podvol.VolumeSpec{Name: volumeName(testUID, "v"), Plugin: PluginName, Mode: podvol.Filesystem, Ephemeral: true,
					Source: &v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{Medium: medium}}}
				if err := p.ResolveSpec(testPod(ctr(nil, nil)), spec); err != nil {
					b.Fatal(err)
				}
				req := request(spec, "v")
				ctx := context.Background()
				b.ResetTimer()
				for b.Loop() {
					if _, err := p.SetUp(ctx, req); err != nil {
						b.Fatal(err)
					}
					if err := p.TearDown(ctx, req); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// mountOthers mounts n small tmpfs file systems under a temporary
// directory, unmounted when b ends.
func mountOthers(b *testing.B, n int) {
	b.Helper()
	dir := b.TempDir()
	for i := range n {
		at := filepath.Join(dir, fmt.Sprint(i))
		if err := os.Mkdir(at, 0o755); err != nil {
			b.Fatal(err)
		}
		if err := syscall.Mount("tmpfs", at, "tmpfs", 0, "size=64k"); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = syscall.Unmount(at, syscall.MNT_DETACH) })
	}
}
