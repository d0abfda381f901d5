package emptydir

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
	"k8s.io/mount-utils"
)

// File system types of the mounts a volume gets.
const (
	tmpfsType     = "tmpfs"
	hugetlbfsType = "hugetlbfs"
)

// mountsAt returns the mounts at the volume directory at, the lowest first
// (the last is the one a lookup of it reaches), and the node's mount table
// when it read it (nil when it did not). It reads the table only when the
// mounter says something is mounted there: a volume on disk, or one not
// mounted yet, costs a statx, where the table is every mount of the node
// and grows with its pods (a tmpfs or two and a CSI mount each). A missing
// directory has nothing mounted at it; any other error of the check (a
// corrupted mount, say) reads the table, and so does a kernel that does
// not say which directories are mount roots, where a statx cannot tell a
// bind mount of the same file system from a directory.
func (p *plugin) mountsAt(at paths) (mounts, table []mount.MountPoint, err error) {
	notMnt, err := p.mounter.IsLikelyNotMountPoint(at.abs)
	return p.mountsAtChecked(at, notMnt, err)
}

// mountsAtChecked is mountsAt once the mounter has said whether something
// is mounted at the directory (notMnt, err of IsLikelyNotMountPoint).
func (p *plugin) mountsAtChecked(at paths, notMnt bool, err error) (mounts, table []mount.MountPoint, _ error) {
	if errors.Is(err, fs.ErrNotExist) || err == nil && notMnt && p.mountRootsKnown() {
		return nil, nil, nil
	}
	if table, err = p.tables.list(p.mounter); err != nil {
		return nil, nil, fmt.Errorf("listing mount points: %w", err)
	}
	if table == nil {
		table = []mount.MountPoint{} // read and empty: non-nil says it was read
	}
	for _, mp := range table {
		if mp.Path == at.abs {
			mounts = append(mounts, mp)
		}
	}
	return mounts, table, nil
}

// ownMountRoot returns the mount at the volume directory at, the one a
// lookup of it reaches, when the directory itself says it is the root of a
// mount of the plugin's own types: a statx that it is a mount's root, and
// the file system's type from an fstatfs (the kubelet's check of a
// volume's medium), both on the directory opened without following a
// symlink. ok is false on any doubt, and the caller reads the mount table:
// a kernel that does not say which directories are mount roots, a
// directory that is none (a fake mounter's mount), another type, an error.
func (p *plugin) ownMountRoot(at paths) (mp mount.MountPoint, ok bool) {
	if !p.mountRootsKnown() {
		return mp, false
	}
	fd, err := p.rfs.OpenDirFd(at.dir)
	if err != nil {
		return mp, false
	}
	defer unix.Close(fd)
	var stx unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BASIC_STATS, &stx); err != nil ||
		stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT == 0 || stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT == 0 {
		return mp, false
	}
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		return mp, false
	}
	switch sfs.Type {
	case unix.TMPFS_MAGIC:
		mp.Type = tmpfsType
	case unix.HUGETLBFS_MAGIC:
		mp.Type = hugetlbfsType
	default:
		return mp, false
	}
	mp.Path = at.abs
	return mp, true
}

// somethingMountedAt reports whether something is mounted at the volume
// directory at: a statx when the kernel says which directories are mount
// roots (a mount root there is mounted, whatever its type), else, or when
// the check fails, whether the mount table lists a mount there
// (mountsAt).
func (p *plugin) somethingMountedAt(at paths) (bool, error) {
	notMnt, err := p.mounter.IsLikelyNotMountPoint(at.abs)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case err == nil && p.mountRootsKnown():
		return !notMnt, nil
	}
	mounts, _, err := p.mountsAt(at)
	return len(mounts) > 0, err
}

// tableReads shares reads of the node's mount table between the calls
// that want one at the same time (the teardowns of many pods' memory
// volumes at once, each of which would read every mount of the node): a
// call gets the table of a read that began after it was made, never an
// older one, so it sees every mount made or removed before it, as a read
// of its own would.
type tableReads struct {
	// reading is held by the one read going on.
	reading sync.Mutex
	mu      sync.Mutex
	// next is the read the calls made since the last began wait for;
	// nil when none waits.
	next *tableRead
}

// tableRead is one read of the mount table and its outcome, final once
// done is closed.
type tableRead struct {
	done  chan struct{}
	table []mount.MountPoint
	err   error
	// calls is how many calls wait for it (under tableReads.mu).
	calls int
}

// list returns m's mount table, from a read that began after the call
// (shared with the calls waiting for the same read). The table is shared:
// callers do not change it.
func (t *tableReads) list(m mount.Interface) ([]mount.MountPoint, error) {
	t.mu.Lock()
	r := t.next
	if r == nil {
		r = &tableRead{done: make(chan struct{})}
		t.next = r
	}
	r.calls++
	t.mu.Unlock()
	t.reading.Lock()
	t.mu.Lock()
	mine := t.next == r
	if mine {
		t.next = nil // calls from now on wait for a later read
	}
	t.mu.Unlock()
	if mine {
		r.table, r.err = m.List()
		close(r.done)
	}
	t.reading.Unlock()
	<-r.done
	return r.table, r.err
}

// mountRootsKnown reports, once, whether the kernel says which directories
// are the roots of mounts (statx's STATX_ATTR_MOUNT_ROOT, Linux 5.8 on).
var mountRootsKnown = sync.OnceValue(func() bool {
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, "/", 0, unix.STATX_BASIC_STATS, &stx); err != nil {
		return false
	}
	return stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0
})

// ownMount reports whether mp is a mount a volume of this plugin gets.
func ownMount(mp mount.MountPoint) bool {
	return mp.Type == tmpfsType || mp.Type == hugetlbfsType
}

// mountPageSize is the page size a hugetlbfs mount shows in its pagesize=
// option, with the kubelet's "i" added so that it compares with a medium's
// size ("2M" is "2Mi"); "" when it shows none.
func mountPageSize(mp mount.MountPoint) string {
	for _, o := range mp.Opts {
		if v, ok := strings.CutPrefix(strings.TrimSpace(o), "pagesize="); ok {
			if !strings.HasSuffix(v, "i") {
				v += "i"
			}
			return v
		}
	}
	return ""
}

// tmpfsNoswapSupported reports, once, whether a tmpfs is mounted with
// noswap, as the kubelet decides it: never in a user namespace (the
// kernel refuses it to an unprivileged tmpfs), always from Linux 6.4 on.
// On an older kernel the kubelet tries a test mount; nodevol leaves
// noswap out instead.
var tmpfsNoswapSupported = sync.OnceValue(func() bool {
	if inUserNamespace() {
		return false
	}
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return false
	}
	return kernelAtLeast(strings.TrimSpace(string(b)), 6, 4)
})

// kernelAtLeast reports whether release ("6.8.0-45-generic") is at
// least major.minor.
func kernelAtLeast(release string, major, minor int) bool {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return false
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(leadingDigits(parts[1]))
	if err1 != nil || err2 != nil {
		return false
	}
	return ma > major || ma == major && mi >= minor
}

// leadingDigits is the digits s starts with ("4" of "4-rc1").
func leadingDigits(s string) string {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return s[:i]
}

// inUserNamespace reports whether the process runs in a user namespace
// other than the initial one, whose uid_map is "0 0 4294967295".
func inUserNamespace() bool {
	f, err := os.Open("/proc/self/uid_map")
	if err != nil {
		return false
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil && line == "" {
		return true // an empty map: a new namespace not set up yet
	}
	var a, b, c int64
	if _, err := fmt.Sscanf(line, "%d %d %d", &a, &b, &c); err != nil {
		return false
	}
	return a != 0 || b != 0 || c != 4294967295
}
