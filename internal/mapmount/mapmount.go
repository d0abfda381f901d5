// Package mapmount is a fake mount.Interface for the workload benchmarks of
// both sides of make bench-compare: nodevol's (volumemanager) and the
// kubelet's (bench/kubelet, a separate module that requires this one).
//
// It answers as mount-utils' FakeMounter does, but keeps its mounts in maps
// keyed by mount point and by device: a mount, an unmount, a mount point
// check and GetMountRefs cost the same with 10 or 10,000 mounts, where
// FakeMounter scans (and at an unmount copies) its whole list and resolves
// symlinks in each path. With W6's 10,000 tmpfs mounts at 5,000 pods,
// FakeMounter's Unmount alone was 23% of nodevol's CPU, a cost of the
// harness that no real mounter has and that both sides paid.
//
// Differences from FakeMounter, none of which the benchmarks depend on:
// paths are cleaned (filepath.Clean), not resolved through symlinks (each
// side names a mount point the same way when it mounts and when it checks);
// List's order is the order of mounting except that an unmount moves the
// last mount into the place it frees (mounts stacked at one path keep their
// order); there is no action log, MountCheckErrors or UnmountFunc.
package mapmount

import (
	"os"
	"path/filepath"
	"slices"
	"sync"

	"k8s.io/mount-utils"
)

// mounter is the fake. The zero value is not usable: call New.
type mounter struct {
	mu sync.Mutex
	// list holds every mount, what List returns.
	list []mount.MountPoint
	// shared: list's array has been handed out by List since it was last
	// copied, so an unmount must copy it before changing it (a caller may
	// be reading it, as a real reader of the mount table has a snapshot).
	shared bool
	// at holds the positions in list of the mounts at each path, ascending
	// (the last one is the mount on top).
	at map[string][]int
	// byDevice counts the mounts of each device by path.
	byDevice map[string]map[string]int
}

var _ mount.Interface = (*mounter)(nil)

// New returns the fake with no mounts: a mount.Interface, all its API.
func New() mount.Interface {
	return &mounter{at: map[string][]int{}, byDevice: map[string]map[string]int{}}
}

// Mount records a mount of source at target.
func (m *mounter) Mount(source, target, fstype string, options []string) error {
	return m.MountSensitive(source, target, fstype, options, nil)
}

// MountSensitive records a mount of source at target; its options are
// options then sensitiveOptions. A bind mount's device is the device of
// the mount at source, as in the kernel's table (and FakeMounter's).
func (m *mounter) MountSensitive(source, target, fstype string, options, sensitiveOptions []string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if slices.Contains(options, "bind") {
		if idx := m.at[filepath.Clean(source)]; len(idx) > 0 {
			source = m.list[idx[0]].Device
		}
	}
	opts := append(slices.Clone(options), sensitiveOptions...)
	if opts == nil {
		opts = []string{}
	}
	path := filepath.Clean(target)
	m.list = append(m.list, mount.MountPoint{Device: source, Path: path, Type: fstype, Opts: opts})
	m.at[path] = append(m.at[path], len(m.list)-1)
	paths := m.byDevice[source]
	if paths == nil {
		paths = map[string]int{}
		m.byDevice[source] = paths
	}
	paths[path]++
	return nil
}

// MountSensitiveWithoutSystemd is Mount: the sensitive options are dropped,
// as FakeMounter drops them.
func (m *mounter) MountSensitiveWithoutSystemd(source, target, fstype string, options, _ []string) error {
	return m.MountSensitive(source, target, fstype, options, nil)
}

// MountSensitiveWithoutSystemdWithMountFlags is Mount too.
func (m *mounter) MountSensitiveWithoutSystemdWithMountFlags(source, target, fstype string, options, _, _ []string) error {
	return m.MountSensitive(source, target, fstype, options, nil)
}

// Unmount removes every mount at target; none there is no error.
func (m *mounter) Unmount(target string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	path := filepath.Clean(target)
	idx := m.at[path]
	delete(m.at, path)
	for i := len(idx) - 1; i >= 0; i-- {
		m.remove(idx[i])
	}
	return nil
}

// remove takes the mount at position i out of list; at no longer holds i.
func (m *mounter) remove(i int) {
	mp := m.list[i]
	if paths := m.byDevice[mp.Device]; paths[mp.Path] > 1 {
		paths[mp.Path]--
	} else if delete(paths, mp.Path); len(paths) == 0 {
		delete(m.byDevice, mp.Device)
	}
	if m.shared {
		m.list = slices.Clone(m.list)
		m.shared = false
	}
	last := len(m.list) - 1
	moved := m.list[last]
	switch {
	case i == last:
	case len(m.at[moved.Path]) == 1:
		m.list[i] = moved
		m.at[moved.Path][0] = i
	default:
		// The last mount is one of several at its path: keep their order
		// by shifting everything after i down one place.
		copy(m.list[i:], m.list[i+1:])
		for j := i; j < last; j++ {
			pos := m.at[m.list[j].Path]
			pos[slices.Index(pos, j+1)] = j
		}
	}
	m.list[last] = mount.MountPoint{}
	m.list = m.list[:last]
}

// List returns every mount. The caller must not change what it returns;
// later mounts and unmounts do not change it either.
func (m *mounter) List() ([]mount.MountPoint, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.shared = true
	return slices.Clip(m.list), nil
}

// IsLikelyNotMountPoint reports whether nothing is mounted at file; a file
// that does not exist is an error (fs.ErrNotExist), as in mount-utils.
func (m *mounter) IsLikelyNotMountPoint(file string) (bool, error) {
	if _, err := os.Stat(file); err != nil {
		return true, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.at[filepath.Clean(file)]) == 0, nil
}

// IsMountPoint is !IsLikelyNotMountPoint.
func (m *mounter) IsMountPoint(file string) (bool, error) {
	notMnt, err := m.IsLikelyNotMountPoint(file)
	if err != nil {
		return false, err
	}
	return !notMnt, nil
}

// CanSafelySkipMountPointCheck is false: callers check before they unmount.
func (m *mounter) CanSafelySkipMountPointCheck() bool { return false }

// GetMountRefs returns the other mount points of the device mounted at
// pathname, and the mount points whose device is pathname itself, in List's
// order; as FakeMounter, a pathname nothing is mounted at has the device "".
func (m *mounter) GetMountRefs(pathname string) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	path := filepath.Clean(pathname)
	device := ""
	if idx := m.at[path]; len(idx) > 0 {
		device = m.list[idx[0]].Device
	}
	var refs []int
	// Two lookups, the device's and the path's; when they are the same
	// device, one.
	for _, dev := range []string{device, path} {
		for p := range m.byDevice[dev] {
			if p == path {
				continue
			}
			for _, i := range m.at[p] {
				if m.list[i].Device == dev {
					refs = append(refs, i)
				}
			}
		}
		if device == path {
			break
		}
	}
	if len(refs) == 0 {
		return nil, nil
	}
	slices.Sort(refs)
	out := make([]string, len(refs))
	for k, i := range refs {
		out[k] = m.list[i].Path
	}
	return out, nil
}
