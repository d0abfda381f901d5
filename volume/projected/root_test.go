package projected

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

// mountInfo is a line of /proc/self/mountinfo: the mount point, its file
// system type and its super block options.
type mountInfo struct{ path, fstype, superOpts string }

// mountsUnder lists the mounts under root, from /proc/self/mountinfo.
func mountsUnder(t *testing.T, root string) []mountInfo {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []mountInfo
	for line := range strings.Lines(string(data)) {
		pre, post, ok := strings.Cut(strings.TrimSpace(line), " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 3 || !strings.HasPrefix(f[4], root+"/") {
			continue
		}
		out = append(out, mountInfo{path: f[4], fstype: g[0], superOpts: g[2]})
	}
	return out
}

// realEnv is an env on root with the real mounter: a plugin started
// afresh, as after a restart.
func realEnv(t *testing.T, root string, tokens *fakeTokens) *env {
	t.Helper()
	e := newEnv(t, root, nil)
	p, err := newPlugin(Config{RootDir: root, Mounter: mount.New(""), Objects: e.objs, Tokens: tokens,
		AllocatableMemory: func() (int64, error) { return 8 << 30, nil }})
	if err != nil {
		t.Fatal(err)
	}
	e.plugin, e.tokens = p, tokens
	e.objs.Put(kubeRootCA())
	e.objs.Put(objtest.Secret("s", map[string]string{"password": "hunter2"}))
	return e
}

// TestRootRestart: the kube-api-access volume and a secret on a real tmpfs
// of the pod's size, the token owned by the pod's runAsUser with mode 0640
// and every file of the pod's fsGroup; after a restart the volume is found
// mounted, SetUp writes nothing, a refreshed token is written into the same
// tmpfs alone, and TearDown leaves nothing.
func TestRootRestart(t *testing.T) {
	roottest.Require(t)
	root := t.TempDir()
	t.Cleanup(func() {
		for _, m := range slices.Backward(mountsUnder(t, root)) {
			_ = syscall.Unmount(m.path, syscall.MNT_DETACH)
		}
	})
	ctx := context.Background()
	tokens := &fakeTokens{}
	e := realEnv(t, root, tokens)
	pod, name := testPod(), "kube-api-access-x7k2q"
	pod.Spec.SecurityContext = &v1.PodSecurityContext{RunAsUser: ptr[int64](1000)}
	gid := int64(2345)
	src := kubeAPIAccess()
	src.Sources = append(src.Sources, secretSource("s", false))
	spec := e.spec(t, pod, name, src)
	dir, err := e.SetUp(ctx, request(pod, spec, name, &gid))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"token": "0640:1000:2345:app-0", "ca.crt": "0644:0:2345:" + caCrt, "namespace": "0644:0:2345:ns", "password": "0644:0:2345:hunter2"}
	if got := objtest.ReadVolume(t, dir, true); !maps.Equal(got, want) {
		t.Errorf("files %v, want %v", got, want)
	}
	mounts := mountsUnder(t, root)
	if len(mounts) != 1 || mounts[0].path != dir || mounts[0].fstype != "tmpfs" || !strings.Contains(mounts[0].superOpts, "size=65536k") {
		t.Fatalf("mounts %+v; want one tmpfs of 64Mi at %s", mounts, dir)
	}

	// A restart: another plugin finds the volume mounted; its SetUp writes
	// nothing, then a refreshed token alone, in the same tmpfs.
	e = realEnv(t, root, tokens)
	points := map[string]bool{}
	for _, m := range mountsUnder(t, root) {
		points[m.path] = true
	}
	found := e.Reconstruct(ctx, volume.Recovery{MountPoints: points})
	if len(found.Mounts) != 1 || found.Mounts[0].Spec.Name != spec.Name || found.Mounts[0].Path != dir || found.Mounts[0].State != podvol.Uncertain {
		t.Fatalf("Reconstruct = %+v", found)
	}
	data, _ := os.Readlink(filepath.Join(dir, "..data"))
	spec = e.spec(t, pod, name, src)
	if _, err := e.SetUp(ctx, request(pod, spec, name, &gid)); err != nil {
		t.Fatal(err)
	}
	if now, _ := os.Readlink(filepath.Join(dir, "..data")); now != data {
		t.Errorf("SetUp after the restart wrote a new version %s (was %s)", now, data)
	}
	tokens.rotate()
	if _, err := e.SetUp(ctx, request(pod, spec, name, &gid)); err != nil {
		t.Fatal(err)
	}
	want["token"] = "0640:1000:2345:app-1"
	if got := objtest.ReadVolume(t, dir, true); !maps.Equal(got, want) {
		t.Errorf("after the refresh: %v, want %v", got, want)
	}
	if m := mountsUnder(t, root); len(m) != 1 {
		t.Errorf("after the refresh: mounts %+v; want the one tmpfs", m)
	}

	m := found.Mounts[0]
	if err := e.TearDown(ctx, volume.MountRequest{Spec: &m.Spec, Volume: m.Volume}); err != nil {
		t.Fatal(err)
	}
	if m := mountsUnder(t, root); len(m) != 0 {
		t.Errorf("left mounted: %+v", m)
	}
	for _, d := range []string{dir, filepath.Join(root, "pods", string(objtest.UID), "plugins", "kubernetes.io~empty-dir", "wrapped_"+name)} {
		if objtest.Exists(t, d) {
			t.Errorf("%s is left", d)
		}
	}
}
