package csiplugin

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"

	"github.com/nodevol/nodevol/internal/ondisk"
	"github.com/nodevol/nodevol/volume"
)

// TestUnstageRefusedWhileReferencedInPods: UnmountDevice refuses (an
// *volume.InUseError naming the references) while a mount under {root}/pods
// references the staged device, here a bind mount of the staging path
// into a pod that nodevol does not know of, and makes no call; a
// reference outside {root}/pods does not count. Once the pod's mount is
// gone the device is unstaged.
func TestUnstageRefusedWhileReferencedInPods(t *testing.T) {
	e := newEnv(t, envOptions{})
	ctx := context.Background()
	spec := testSpec(drv)
	stagingPath, err := e.p.MountDevice(ctx, volume.DeviceRequest{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	podMount := filepath.Join(e.root, "pods", "uid-unknown", "volumes", "kubernetes.io~csi", "pv-1", "mount")
	elsewhere := filepath.Join(e.root, "plugins", "backup", "mount")
	if err := e.mounter.Mount("/dev/sdx", stagingPath, "ext4", nil); err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{podMount, elsewhere} {
		if err := e.mounter.Mount(stagingPath, target, "", []string{"bind"}); err != nil {
			t.Fatal(err)
		}
	}

	err = e.p.UnmountDevice(ctx, volume.DeviceRequest{Spec: spec})
	var inUse *volume.InUseError
	if !errors.As(err, &inUse) || !slices.Equal(inUse.Refs, []string{podMount}) {
		t.Fatalf("UnmountDevice with the staging path bound into a pod = %v; want an *volume.InUseError naming only %s", err, podMount)
	}
	if n := e.srv.Calls("NodeUnstageVolume"); n != 0 {
		t.Errorf("NodeUnstageVolume called %d times under a pod's mount, want 0", n)
	}
	if rec, err := e.readRecord(t, filepath.Dir(stagingPath)); err != nil || rec.Phase != ondisk.PhaseStaged {
		t.Errorf("staging record after the refusal = %+v, %v; want Staged", rec, err)
	}

	for _, target := range []string{podMount, stagingPath} {
		if err := e.mounter.Unmount(target); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.p.UnmountDevice(ctx, volume.DeviceRequest{Spec: spec}); err != nil {
		t.Fatalf("UnmountDevice once the pod's mount is gone: %v", err)
	}
	if n := e.srv.Calls("NodeUnstageVolume"); n != 1 {
		t.Errorf("NodeUnstageVolume called %d times, want 1", n)
	}
}
