package secret

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/internal/roottest"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
	"github.com/nodevol/nodevol/volume/internal/objvolume/objtest"
)

// mountLine is a line of /proc/self/mountinfo.
type mountLine struct{ path, fstype, superOpts string }

// mountsUnder lists the mounts below root, from /proc/self/mountinfo.
func mountsUnder(t *testing.T, root string) []mountLine {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []mountLine
	for line := range strings.Lines(string(data)) {
		pre, post, ok := strings.Cut(strings.TrimSpace(line), " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if ok && len(f) >= 6 && len(g) >= 3 && strings.HasPrefix(f[4], root+"/") {
			out = append(out, mountLine{path: f[4], fstype: g[0], superOpts: g[2]})
		}
	}
	return out
}

// rootEnv is an env on the real mounter; the cleanup unmounts what a
// failed test left.
func rootEnv(t *testing.T) env {
	t.Helper()
	roottest.Require(t)
	root := t.TempDir()
	t.Cleanup(func() {
		for _, m := range slices.Backward(mountsUnder(t, root)) {
			_ = syscall.Unmount(m.path, syscall.MNT_DETACH)
		}
	})
	return newEnv(t, root, mount.New(""))
}

// TestRootSecret: on a real tmpfs of the pod's size, the files with their
// modes and the pod's fsGroup exactly; after a restart the tmpfs is
// found Uncertain, SetUp changes nothing, and TearDown leaves nothing.
func TestRootSecret(t *testing.T) {
	e := rootEnv(t)
	ctx := context.Background()
	e.Objs.Put(objtest.Secret("s", map[string]string{"tls.key": "KEY", "tls.crt": "CRT", "unused": "x"}))
	src := v1.SecretVolumeSource{SecretName: "s", DefaultMode: ptr[int32](0o400),
		Items: []v1.KeyToPath{{Key: "tls.key", Path: "tls/key"}, {Key: "tls.crt", Path: "crt", Mode: ptr[int32](0o644)}}}
	spec := e.spec(t, "creds", src)
	fsGroup := int64(1234)
	req := objtest.Request(spec, "creds", &fsGroup)
	dir, err := e.SetUp(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	mounts := mountsUnder(t, e.Root)
	if len(mounts) != 1 || mounts[0].path != dir || mounts[0].fstype != "tmpfs" || !slices.Contains(strings.Split(mounts[0].superOpts, ","), "size=65536k") {
		t.Fatalf("mounts %+v, want one tmpfs of size=65536k (the pod's 64Mi) at %s", mounts, dir)
	}
	if got, want := objtest.ReadVolume(t, dir, true), map[string]string{"tls/key": "0440:0:1234:KEY", "crt": "0644:0:1234:CRT"}; !maps.Equal(got, want) {
		t.Fatalf("files %v, want %v", got, want)
	}
	// The directories are the group's, setgid, as the kubelet's ownership
	// change leaves them.
	for _, d := range []string{dir, filepath.Join(dir, "..data/tls")} {
		fi, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if gid := fi.Sys().(*syscall.Stat_t).Gid; gid != 1234 || fi.Mode()&os.ModeSetgid == 0 {
			t.Errorf("%s: group %d, mode %v; want group 1234, setgid", d, gid, fi.Mode())
		}
	}

	after := newEnv(t, e.Root, mount.New(""))
	after.Objs.Put(objtest.Secret("s", map[string]string{"tls.key": "KEY", "tls.crt": "CRT", "unused": "x"}))
	points := map[string]bool{}
	for _, m := range mountsUnder(t, e.Root) {
		points[m.path] = true
	}
	found := after.Plugin.(volume.Reconstructor).Reconstruct(ctx, volume.Recovery{MountPoints: points})
	if len(found.Mounts) != 1 || found.Mounts[0].Spec.Name != spec.Name || found.Mounts[0].Path != dir || found.Mounts[0].State != podvol.Uncertain {
		t.Fatalf("Reconstruct = %+v, want %s Uncertain at %s", found, spec.Name, dir)
	}
	if _, err := after.SetUp(ctx, req); err != nil {
		t.Fatal(err)
	}
	if s := after.Steps.Taken(); len(s) != 0 || len(mountsUnder(t, e.Root)) != 1 {
		t.Fatalf("SetUp after the restart took steps %v", s)
	}
	if err := after.TearDown(ctx, volume.MountRequest{Volume: podvol.PodVolume{Pod: podvol.PodRef{UID: objtest.UID}, SpecName: "creds"}}); err != nil {
		t.Fatal(err)
	}
	if m := mountsUnder(t, e.Root); len(m) != 0 || objtest.Exists(t, dir) || objtest.Exists(t, filepath.Join(e.Root, "pods", string(objtest.UID), "plugins", "kubernetes.io~empty-dir", "wrapped_creds")) {
		t.Fatalf("TearDown left mounts %+v, or the directories", m)
	}
}
