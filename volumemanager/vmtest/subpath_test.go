package vmtest

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/nodevol/nodevol/volume/subpath"
)

// TestEnvSubPath: on the env's fake mounter a subPath bind mount is made
// and checked as on a node: Prepare of a subPath through a symlink in the
// pod's claim returns the kubelet's target, bound (as the fake records it)
// to the directory the symlink leads to; after DeletePod the manager has
// taken it down before it unpublished the volume.
func TestEnvSubPath(t *testing.T) {
	env, _, pod, ctx := mountClaimPod(t, EnvOptions{})
	vols := env.Manager.GetMountedVolumesForPod(pod.UID)
	if len(vols) != 1 {
		t.Fatalf("mounted volumes %v, want the claim's", vols)
	}
	vol := vols[0]
	// What an init container would lay out in the volume.
	if err := os.MkdirAll(filepath.Join(vol.Path, "v2"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("v2", filepath.Join(vol.Path, "current")); err != nil {
		t.Fatal(err)
	}

	target, err := env.Manager.SubPaths().Prepare(ctx, subpath.Mount{
		Pod: pod.UID, Volume: vol.DirName, VolumePath: vol.Path, Container: "app", Index: 0, SubPath: "current",
	})
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	if want := filepath.Join(env.RootDir, "pods", string(pod.UID), "volume-subpaths", vol.DirName, "app", "0"); target != want {
		t.Errorf("Prepare = %s, want %s", target, want)
	}
	if b, ok := env.Binds.Bound(target); !ok || b.File != filepath.Join(vol.Path, "v2") {
		t.Errorf("%s is bound to %+v, want %s", target, b, filepath.Join(vol.Path, "v2"))
	}

	env.Manager.DeletePod(pod)
	if err := env.Manager.WaitForUnmount(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if b, ok := env.Binds.Bound(target); ok {
		t.Errorf("%s still bound to %s after the pod went", target, b.File)
	}
	if _, err := os.Lstat(target); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s left after the pod went: %v", target, err)
	}
}
