package downwardapi

import (
	"context"
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

// TestRootRestart: on a real tmpfs, the files with the pod's fsGroup; after
// a restart the volume is found mounted, a label change is written into the
// same tmpfs, and TearDown leaves nothing.
func TestRootRestart(t *testing.T) {
	roottest.Require(t)
	root := t.TempDir()
	t.Cleanup(func() {
		for _, m := range slices.Backward(mountsUnder(t, root)) {
			_ = syscall.Unmount(m.path, syscall.MNT_DETACH)
		}
	})
	ctx := context.Background()
	newReal := func() *plugin {
		p, err := newPlugin(Config{RootDir: root, Mounter: mount.New(""), NodeAllocatable: nodeAlloc})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	src := v1.DownwardAPIVolumeSource{DefaultMode: ptr[int32](0o644), Items: []v1.DownwardAPIVolumeFile{
		field("labels", "metadata.labels"), field("annotations", "metadata.annotations"),
		res("mem", "app", "limits.memory", "1Mi"), res("cpu", "app", "requests.cpu", "1m"),
	}}
	src.Items[1].Mode = ptr[int32](0o400)
	gid := int64(2345)
	p := newReal()
	spec := resolved(t, p, testPod(map[string]string{"app": "web"}), "podinfo", src)
	dir, err := p.SetUp(ctx, request(spec, "podinfo", &gid))
	if err != nil {
		t.Fatal(err)
	}
	want := "annotations -r--r----- \"note=\\\"a\\\\nb\\\"\"\ncpu -rw-r--r-- \"250\"\nlabels -rw-r--r-- \"app=\\\"web\\\"\"\nmem -rw-r--r-- \"256\""
	if got := read(t, dir, "annotations", "cpu", "labels", "mem"); got != want {
		t.Errorf("files:\n%s\nwant:\n%s", got, want)
	}
	for _, f := range []string{"annotations", "labels", "..data"} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || fi.Sys().(*syscall.Stat_t).Gid != 2345 {
			t.Errorf("%s: not of group 2345 (%v)", f, err)
		}
	}
	mounts := mountsUnder(t, root)
	if len(mounts) != 1 || mounts[0].path != dir || mounts[0].fstype != "tmpfs" || !strings.Contains(mounts[0].superOpts, "size=262144k") {
		t.Fatalf("mounts %+v; want one tmpfs of 256Mi at %s", mounts, dir)
	}

	// A restart: another plugin finds the volume, and the next SetUp, with
	// new labels, writes into the same tmpfs.
	p = newReal()
	table, err := mount.New("").List()
	if err != nil {
		t.Fatal(err)
	}
	points := map[string]bool{}
	for _, m := range table {
		points[m.Path] = true
	}
	found := p.Reconstruct(ctx, volume.Recovery{MountPoints: points})
	if len(found.Mounts) != 1 || found.Mounts[0].Spec.Name != spec.Name || found.Mounts[0].Path != dir || found.Mounts[0].State != podvol.Uncertain {
		t.Fatalf("Reconstruct = %+v", found)
	}
	spec = resolved(t, p, testPod(map[string]string{"app": "web", "rev": "2"}), "podinfo", src)
	if _, err := p.SetUp(ctx, request(spec, "podinfo", &gid)); err != nil {
		t.Fatal(err)
	}
	if got := read(t, dir, "labels"); got != "labels -rw-r--r-- \"app=\\\"web\\\"\\nrev=\\\"2\\\"\"" {
		t.Errorf("after the label change: %s", got)
	}
	if m := mountsUnder(t, root); len(m) != 1 {
		t.Errorf("after the update: mounts %+v; want the one tmpfs", m)
	}

	m := found.Mounts[0]
	if err := p.TearDown(ctx, volume.MountRequest{Spec: &m.Spec, Volume: m.Volume}); err != nil {
		t.Fatal(err)
	}
	if m := mountsUnder(t, root); len(m) != 0 {
		t.Errorf("left mounted: %+v", m)
	}
	for _, d := range []string{dir, filepath.Dir(readyPath(root, "podinfo"))} {
		if objtest.Exists(t, d) {
			t.Errorf("%s is left", d)
		}
	}
}
