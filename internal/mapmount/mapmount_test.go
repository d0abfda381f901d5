package mapmount

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"k8s.io/mount-utils"
)

// op is one call in a sequence: mount (source, target, fstype, options) or
// unmount (target). Paths starting with "@" are under the test's directory.
type op struct {
	unmount bool
	source  string
	target  string
	fstype  string
	opts    []string
}

func mnt(source, target, fstype string, opts ...string) op {
	return op{source: source, target: target, fstype: fstype, opts: opts}
}

func umnt(target string) op { return op{unmount: true, target: target} }

// dirs are the directories every case checks, which exist under the
// test's directory; "@gone" does not.
var dirs = []string{"@a", "@b", "@c", "@d", "@gone"}

// TestAgainstFakeMounter runs each sequence on the fake and on mount-utils'
// FakeMounter and compares their answers: List (by path, the mounts at one
// path in order), IsLikelyNotMountPoint, IsMountPoint and GetMountRefs of
// every directory.
func TestAgainstFakeMounter(t *testing.T) {
	cases := []struct {
		name string
		ops  []op
	}{
		{"nothing mounted", nil},
		{"one tmpfs", []op{mnt("tmpfs", "@a", "tmpfs")}},
		{"one tmpfs unmounted", []op{mnt("tmpfs", "@a", "tmpfs"), umnt("@a")}},
		{"unmount of what is not mounted", []op{mnt("tmpfs", "@a", "tmpfs"), umnt("@b")}},
		{"tmpfs mounts share the device", []op{
			mnt("tmpfs", "@a", "tmpfs"), mnt("tmpfs", "@b", "tmpfs"), mnt("tmpfs", "@c", "tmpfs")}},
		{"unmount in the middle", []op{
			mnt("tmpfs", "@a", "tmpfs"), mnt("tmpfs", "@b", "tmpfs"), mnt("tmpfs", "@c", "tmpfs"), umnt("@a")}},
		{"staged and bind-mounted twice", []op{
			mnt("/dev/sdb", "@a", "ext4"), mnt("@a", "@b", "", "bind"), mnt("@a", "@c", "", "bind", "ro")}},
		{"bind mounts unmounted, then the staging", []op{
			mnt("/dev/sdb", "@a", "ext4"), mnt("@a", "@b", "", "bind"), mnt("@a", "@c", "", "bind"),
			umnt("@b"), umnt("@c"), umnt("@a")}},
		{"bind mount of a path nothing is mounted at", []op{mnt("@d", "@b", "", "bind")}},
		{"device named by a mount point's path", []op{mnt("/dev/sdb", "@a", "ext4"), mnt("@a", "@b", "ext4")}},
		{"mounts stacked at one path", []op{
			mnt("tmpfs", "@a", "tmpfs"), mnt("nodev", "@a", "hugetlbfs", "pagesize=2M"), mnt("tmpfs", "@b", "tmpfs")}},
		{"stacked mounts all unmounted at once", []op{
			mnt("tmpfs", "@a", "tmpfs"), mnt("nodev", "@a", "hugetlbfs"), mnt("tmpfs", "@b", "tmpfs"), umnt("@a")}},
		{"unmount moves a stacked last mount", []op{
			mnt("tmpfs", "@a", "tmpfs"), mnt("/dev/sdb", "@b", "ext4"), mnt("/dev/sdc", "@b", "ext4"),
			mnt("tmpfs", "@c", "tmpfs"), mnt("/dev/sdd", "@c", "ext4"), umnt("@a"), umnt("@b")}},
		{"empty device", []op{mnt("", "@a", "tmpfs"), mnt("", "@b", "tmpfs"), mnt("tmpfs", "@c", "tmpfs")}},
		{"uncleaned paths", []op{mnt("tmpfs", "@a/", "tmpfs"), mnt("tmpfs", "@b/../b", "tmpfs"), umnt("@a//")}},
		{"sensitive options", []op{mnt("/dev/sdb", "@a", "ext4", "ro")}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root, err := filepath.EvalSymlinks(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range []string{"a", "b", "c", "d"} {
				if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			abs := func(p string) string { return strings.ReplaceAll(p, "@", root+"/") }
			fake, ours := mount.NewFakeMounter(nil), New()
			for _, m := range []mount.Interface{fake, ours} {
				for _, o := range c.ops {
					if err := apply(m, o, abs); err != nil {
						t.Fatalf("%T: %v: %v", m, o, err)
					}
				}
			}
			if got, want := byPath(ours), byPath(fake); !slices.Equal(got, want) {
				t.Errorf("List = %q, FakeMounter's %q", got, want)
			}
			for _, d := range dirs {
				if got, want := answers(ours, abs(d)), answers(fake, abs(d)); got != want {
					t.Errorf("%s: %s, FakeMounter: %s", d, got, want)
				}
			}
		})
	}
}

func apply(m mount.Interface, o op, abs func(string) string) error {
	if o.unmount {
		return m.Unmount(abs(o.target))
	}
	return m.MountSensitive(abs(o.source), abs(o.target), o.fstype, o.opts, nil)
}

// byPath returns m's mounts as "path device type", sorted by path and in
// List's order at one path.
func byPath(m interface {
	List() ([]mount.MountPoint, error)
}) []string {
	mps, err := m.List()
	if err != nil {
		return []string{err.Error()}
	}
	out := make([]string, len(mps))
	for i, mp := range mps {
		out[i] = mp.Path + " " + mp.Device + " " + mp.Type
	}
	slices.SortStableFunc(out, func(a, b string) int { return strings.Compare(strings.Fields(a)[0], strings.Fields(b)[0]) })
	return out
}

// answers returns m's answers about path, the references sorted.
func answers(m mount.Interface, path string) string {
	notMnt, err := m.IsLikelyNotMountPoint(path)
	isMnt, err2 := m.IsMountPoint(path)
	refs, err3 := m.GetMountRefs(path)
	slices.Sort(refs)
	return fmt.Sprintf("notMnt=%v (%v) isMnt=%v (%v) refs=%q (%v)", notMnt, errors.Is(err, fs.ErrNotExist), isMnt, errors.Is(err2, fs.ErrNotExist), refs, err3)
}

// TestListIsASnapshot: what List returned does not change with later
// unmounts and mounts, as a read of the mount table does not.
func TestListIsASnapshot(t *testing.T) {
	m := New()
	for _, p := range []string{"/a", "/b", "/c"} {
		if err := m.Mount("tmpfs", p, "tmpfs", nil); err != nil {
			t.Fatal(err)
		}
	}
	before, _ := m.List()
	want := slices.Clone(before)
	if err := m.Unmount("/a"); err != nil {
		t.Fatal(err)
	}
	if err := m.Mount("tmpfs", "/d", "tmpfs", nil); err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(before, want, func(a, b mount.MountPoint) bool { return a.Path == b.Path && a.Device == b.Device }) {
		t.Errorf("List's answer changed to %v, was %v", before, want)
	}
	after, _ := m.List()
	got := byPath(mountsOf(after))
	if w := []string{"/b tmpfs tmpfs", "/c tmpfs tmpfs", "/d tmpfs tmpfs"}; !slices.Equal(got, w) {
		t.Errorf("List after = %q, want %q", got, w)
	}
}

// mountsOf is a lister whose List is itself.
type mountsOf []mount.MountPoint

func (l mountsOf) List() ([]mount.MountPoint, error) { return l, nil }

// TestConcurrent: goroutines mounting, listing and unmounting their own
// paths each find their own mount in every List while it is mounted (run
// with -race).
func TestConcurrent(t *testing.T) {
	m := New()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				p := fmt.Sprintf("/g%d/%d", g, i)
				if err := m.Mount("tmpfs", p, "tmpfs", nil); err != nil {
					errs <- err
					return
				}
				mps, _ := m.List()
				if !slices.ContainsFunc(mps, func(mp mount.MountPoint) bool { return mp.Path == p }) {
					errs <- fmt.Errorf("%s mounted, not in List", p)
					return
				}
				if i%2 == 0 {
					if err := m.Unmount(p); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if mps, _ := m.List(); len(mps) != 8*100 {
		t.Errorf("%d mounts left, want %d", len(mps), 8*100)
	}
}
