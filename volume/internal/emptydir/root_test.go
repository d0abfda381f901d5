package emptydir

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/internal/roottest"
	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume"
)

// mountInfo is a line of /proc/self/mountinfo.
type mountInfo struct {
	path, opts, fstype, source, superOpts string
}

// mountsUnder lists the mounts under root (bottom first), from
// /proc/self/mountinfo.
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
		if !ok || len(f) < 6 || len(g) < 3 || !strings.HasPrefix(f[4], root+"/") {
			continue
		}
		out = append(out, mountInfo{path: f[4], opts: f[5], fstype: g[0], source: g[1], superOpts: g[2]})
	}
	return out
}

// rootPlugin is a plugin on a temporary root and the real mounter; the
// cleanup unmounts whatever a failed test left under the root.
func rootPlugin(t *testing.T, root string) *plugin {
	t.Helper()
	roottest.Require(t)
	if root == "" {
		root = t.TempDir()
		t.Cleanup(func() {
			for _, m := range slices.Backward(mountsUnder(t, root)) {
				_ = syscall.Unmount(m.path, syscall.MNT_DETACH)
			}
		})
	}
	p, err := newPlugin(Config{RootDir: root, Mounter: mount.New(""), AllocatableMemory: func() (int64, error) { return 8 << 30, nil }})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// checkNothingLeft checks that no mount is under the root and that the
// volume's directory and ready directory are gone.
func checkNothingLeft(t *testing.T, p *plugin, name string) {
	t.Helper()
	if m := mountsUnder(t, p.root); len(m) != 0 {
		t.Errorf("left mounted: %+v", m)
	}
	at, _ := p.volumePaths(testUID, name)
	for _, d := range []string{at.abs, filepath.Join(p.root, at.readyDir)} {
		if _, err := os.Lstat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is left (%v)", d, err)
		}
	}
}

func resolved(t *testing.T, p *plugin, pod *v1.Pod, name string, src v1.EmptyDirVolumeSource) *podvol.VolumeSpec {
	t.Helper()
	s := &podvol.VolumeSpec{Name: volumeName(testUID, name), Plugin: PluginName, Mode: podvol.Filesystem, Ephemeral: true, Source: &v1.VolumeSource{EmptyDir: &src}}
	if err := p.ResolveSpec(pod, s); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestRootDiskFSGroup(t *testing.T) {
	p := rootPlugin(t, "")
	spec := resolved(t, p, testPod(ctr(nil, nil)), "scratch", v1.EmptyDirVolumeSource{})
	req := request(spec, "scratch")
	gid := int64(2345)
	req.Volume.FSGroup, req.ChangeOwnership = &gid, true
	dir, err := p.SetUp(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Gid != 2345 || fi.Mode()&os.ModeSetgid == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("volume root: mode %v, gid %d; want drwxrwxrwx with setgid, group 2345", fi.Mode(), st.Gid)
	}
	// A file the pod writes inherits the group (setgid).
	write(t, filepath.Join(dir, "f"), "x")
	if fi, _ := os.Lstat(filepath.Join(dir, "f")); fi.Sys().(*syscall.Stat_t).Gid != 2345 {
		t.Errorf("a new file's group is %d, want 2345", fi.Sys().(*syscall.Stat_t).Gid)
	}
	if m := mountsUnder(t, p.root); len(m) != 0 {
		t.Errorf("a disk volume mounted something: %+v", m)
	}
	if err := p.TearDown(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	checkNothingLeft(t, p, "scratch")
}

func TestRootMemory(t *testing.T) {
	p := rootPlugin(t, "")
	spec := resolved(t, p, testPod(ctr(mem("1Gi"), mem("1Gi"))), "mem", v1.EmptyDirVolumeSource{Medium: "Memory", SizeLimit: quantity("64Mi")})
	dir, err := p.SetUp(context.Background(), request(spec, "mem"))
	if err != nil {
		t.Fatal(err)
	}
	want := mountInfo{path: dir, opts: "rw,relatime", fstype: "tmpfs", source: "tmpfs", superOpts: "rw,size=65536k"}
	if tmpfsNoswapSupported() {
		want.superOpts += ",noswap"
	}
	if got := mountsUnder(t, p.root); len(got) != 1 || got[0] != want {
		t.Errorf("mounts %+v, want %+v", got, want)
	}
	if fi, err := os.Lstat(dir); err != nil || fi.Mode().Perm() != 0o777 || fi.Mode()&os.ModeSticky == 0 {
		t.Errorf("tmpfs root: %v, %v; want the tmpfs's drwxrwxrwt", fi.Mode(), err)
	}
	write(t, filepath.Join(dir, "d/data"), string(make([]byte, 40960)))
	st, ok, err := p.VolumeStats(context.Background(), spec, dir, "")
	if err != nil || !ok || st.CapacityBytes != 64<<20 || st.UsedBytes < 40960 || st.InodesUsed != 3 {
		t.Errorf("stats %+v, %v, %v; want capacity 64Mi, 40960 bytes and 3 inodes used", st, ok, err)
	}
	if err := p.TearDown(context.Background(), request(spec, "mem")); err != nil {
		t.Fatal(err)
	}
	checkNothingLeft(t, p, "mem")
}

// TestRootHugePages mounts a hugetlbfs of 2Mi pages; mounting one
// reserves no page, so the kernel's support for the size is enough.
func TestRootHugePages(t *testing.T) {
	p := rootPlugin(t, "")
	fsys, _ := os.ReadFile("/proc/filesystems")
	if _, err := os.Stat("/sys/kernel/mm/hugepages/hugepages-2048kB"); err != nil || !strings.Contains(string(fsys), "hugetlbfs") {
		t.Skip("the kernel has no hugetlbfs with 2Mi pages: the fake mounter's tests cover hugepages")
	}
	hp := v1.ResourceList{"hugepages-2Mi": resource.MustParse("4Mi")}
	spec := resolved(t, p, testPod(ctr(hp, hp)), "hp", v1.EmptyDirVolumeSource{Medium: "HugePages"})
	dir, err := p.SetUp(context.Background(), request(spec, "hp"))
	if err != nil {
		t.Fatal(err)
	}
	got := mountsUnder(t, p.root)
	if len(got) != 1 || got[0].fstype != "hugetlbfs" || got[0].source != "nodev" || got[0].superOpts != "rw,pagesize=2M" || got[0].path != dir {
		t.Errorf("mounts %+v, want a hugetlbfs with pagesize=2M at %s", got, dir)
	}
	if _, err := p.SetUp(context.Background(), request(spec, "hp")); err != nil || len(mountsUnder(t, p.root)) != 1 {
		t.Errorf("SetUp again: %v, mounts %+v", err, mountsUnder(t, p.root))
	}
	if err := p.TearDown(context.Background(), request(spec, "hp")); err != nil {
		t.Fatal(err)
	}
	checkNothingLeft(t, p, "hp")
}

// recovery reads the mount table as the volume manager does.
func recovery(t *testing.T) volume.Recovery {
	t.Helper()
	mps, err := mount.New("").List()
	if err != nil {
		t.Fatal(err)
	}
	rc := volume.Recovery{MountPoints: map[string]bool{}}
	for _, mp := range mps {
		rc.MountPoints[mp.Path] = true
	}
	return rc
}

// states maps each reconstructed volume's spec name to its state.
func states(f volume.Found) map[string]podvol.MountState {
	out := map[string]podvol.MountState{}
	for _, m := range f.Mounts {
		out[m.Volume.SpecName] = m.State
	}
	return out
}

func TestRootRestart(t *testing.T) {
	p := rootPlugin(t, "")
	pod := testPod(ctr(mem("1Gi"), mem("1Gi")))
	disk := resolved(t, p, pod, "disk", v1.EmptyDirVolumeSource{})
	memv := resolved(t, p, pod, "mem", v1.EmptyDirVolumeSource{Medium: "Memory"})
	for name, s := range map[string]*podvol.VolumeSpec{"disk": disk, "mem": memv} {
		dir, err := p.SetUp(context.Background(), request(s, name))
		if err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(dir, "data"), "kept")
	}
	// A restart: a new plugin on the same root.
	q := rootPlugin(t, p.root)
	f := q.Reconstruct(context.Background(), recovery(t))
	if got, want := states(f), map[string]podvol.MountState{"disk": podvol.Uncertain, "mem": podvol.Mounted}; !maps.Equal(got, want) || f.Attempted != 2 {
		t.Fatalf("reconstructed %v (attempted %d), want %v", got, f.Attempted, want)
	}
	for name, s := range map[string]*podvol.VolumeSpec{"disk": disk, "mem": memv} {
		dir, err := q.SetUp(context.Background(), request(s, name))
		if b, rerr := os.ReadFile(filepath.Join(dir, "data")); err != nil || rerr != nil || string(b) != "kept" {
			t.Errorf("SetUp of %s after the restart: %v; its data %q, %v", name, err, b, rerr)
		}
	}
	if got := mountsUnder(t, p.root); len(got) != 1 {
		t.Errorf("mounts after SetUp again: %+v, want the one tmpfs", got)
	}
	// A reboot: the tmpfs is gone, its ready file is not.
	at, _ := q.volumePaths(testUID, "mem")
	if err := syscall.Unmount(at.abs, 0); err != nil {
		t.Fatal(err)
	}
	f = q.Reconstruct(context.Background(), recovery(t))
	if got := states(f); got["mem"] != podvol.Uncertain {
		t.Errorf("after a reboot the memory volume is %v, want Uncertain", got["mem"])
	}
	if _, err := q.SetUp(context.Background(), request(memv, "mem")); err != nil {
		t.Fatal(err)
	}
	if got := mountsUnder(t, p.root); len(got) != 1 || got[0].path != at.abs || got[0].fstype != "tmpfs" {
		t.Errorf("mounts after SetUp after a reboot: %+v, want a tmpfs at %s", got, at.abs)
	}
	for _, name := range []string{"disk", "mem"} {
		if err := q.TearDown(context.Background(), request(&podvol.VolumeSpec{Name: volumeName(testUID, name), Plugin: PluginName}, name)); err != nil {
			t.Fatal(err)
		}
	}
	checkNothingLeft(t, q, "disk")
	checkNothingLeft(t, q, "mem")
}
