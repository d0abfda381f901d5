package emptydir

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/internal/steptest"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// TestCrashPoints stops SetUp and TearDown at each of their steps, as a
// process killed there would, and restarts on the same disk and mount
// table: reconstruction finds the volume (if anything of it is left), and
// SetUp then TearDown (or TearDown alone) leave nothing behind.
func TestCrashPoints(t *testing.T) {
	for _, medium := range []v1.StorageMedium{"", "Memory"} {
		for _, op := range []string{"SetUp", "TearDown"} {
			t.Run(op+" medium "+string(medium), func(t *testing.T) {
				for k := 1; ; k++ {
					if !crashAt(t, medium, op, k) {
						if k < 3 {
							t.Fatalf("only %d steps", k-1)
						}
						return
					}
				}
			})
		}
	}
}

// crashAt runs op stopped at step k and recovers; it reports whether op
// had a k-th step.
func crashAt(t *testing.T, medium v1.StorageMedium, op string, k int) bool {
	t.Helper()
	root, fake := t.TempDir(), mount.NewFakeMounter(nil)
	crasher := steptest.New(nil)
	p, err := newPlugin(Config{RootDir: root, Mounter: fake, Steps: crasher.Take})
	if err != nil {
		t.Fatal(err)
	}
	spec := &podvol.VolumeSpec{Name: volumeName(testUID, "v"), Plugin: PluginName, Source: &v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{Medium: medium}}}
	if err := p.ResolveSpec(testPod(ctr(mem("1Gi"), mem("1Gi"))), spec); err != nil {
		t.Fatal(err)
	}
	if op == "TearDown" {
		dir, err := p.SetUp(context.Background(), request(spec, "v"))
		if err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(dir, "d/f"), "x")
	}
	crasher.Arm(k)
	if op == "SetUp" {
		_, err = p.SetUp(context.Background(), request(spec, "v"))
	} else {
		err = p.TearDown(context.Background(), request(spec, "v"))
	}
	_, stopped := crasher.Steps()
	if stopped == nil {
		return false
	}
	if err == nil {
		t.Fatalf("step %d (%s): %s stopped but returned no error", k, stopped, op)
	}
	// The restart.
	q, err := newPlugin(Config{RootDir: root, Mounter: fake})
	if err != nil {
		t.Fatal(err)
	}
	rc := volume.Recovery{MountPoints: map[string]bool{}}
	for _, mp := range fake.MountPoints {
		rc.MountPoints[mp.Path] = true
	}
	found := q.Reconstruct(context.Background(), rc)
	if len(found.Unreadable) != 0 || len(found.Mounts) > 1 {
		t.Fatalf("step %d (%s): reconstructed %+v", k, stopped, found)
	}
	if op == "SetUp" && len(found.Mounts) == 1 {
		if _, err := q.SetUp(context.Background(), request(spec, "v")); err != nil {
			t.Fatalf("step %d (%s): SetUp after the restart: %v", k, stopped, err)
		}
	}
	if len(found.Mounts) == 1 {
		if err := q.TearDown(context.Background(), request(&podvol.VolumeSpec{Name: spec.Name, Plugin: PluginName}, "v")); err != nil {
			t.Fatalf("step %d (%s): TearDown after the restart: %v", k, stopped, err)
		}
	}
	at, _ := q.volumePaths(testUID, "v")
	for _, d := range []string{at.abs, filepath.Join(root, at.readyDir)} {
		if _, err := os.Lstat(d); !os.IsNotExist(err) {
			t.Errorf("step %d (%s): %s left (%v)", k, stopped, d, err)
		}
	}
	if len(fake.MountPoints) != 0 {
		t.Errorf("step %d (%s): left mounted %v", k, stopped, fake.MountPoints)
	}
	return true
}
