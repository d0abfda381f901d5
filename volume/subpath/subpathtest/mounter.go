// Package subpathtest has a fake mounter on which the subPath bind mounts
// of package subpath work in unit tests: mount-utils' FakeMounter records
// a mount and makes none, so the check subpath's Prepare makes after
// mounting (is the target now the file it opened?) would find the empty
// target and fail. Mounter records what each bind mount binds, as
// mount(2) would bind it, and answers that check (subpath.BindRecorder).
package subpathtest

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"

	"k8s.io/mount-utils"
)

// bind is what a bind mount of the fake binds.
type bind struct {
	// Source is the mount's source as given: for the subPath bind
	// mounts, /proc/{pid}/fd/{n}.
	Source string
	// File is the path of the file bound: for a /proc/{pid}/fd/{n}
	// source, the path of the file open as that descriptor when it was
	// mounted, as /proc shows it.
	File string
	// Dev and Ino identify the file bound.
	Dev, Ino uint64
	// Flags are the mount(8) flags the bind mount was made with (the
	// FakeMounter drops them): the subPath bind mounts pass
	// --no-canonicalize.
	Flags []string
}

// Mounter is a mount.FakeMounter that records what its bind mounts bind:
// every call goes to the FakeMounter, which keeps its mount points and
// log; a bind mount also records its source's file at the moment it is
// mounted, until it is unmounted. Safe for concurrent use.
type Mounter struct {
	*mount.FakeMounter
	mu    sync.Mutex
	binds map[string]bind
}

// NewMounter returns a Mounter recording in fake; nil makes a new
// FakeMounter.
func NewMounter(fake *mount.FakeMounter) *Mounter {
	if fake == nil {
		fake = mount.NewFakeMounter(nil)
	}
	return &Mounter{FakeMounter: fake, binds: map[string]bind{}}
}

// Mount is the FakeMounter's, recording a bind mount.
func (m *Mounter) Mount(source, target, fstype string, options []string) error {
	return m.mount(source, target, options, nil, func() error { return m.FakeMounter.Mount(source, target, fstype, options) })
}

// MountSensitive is the FakeMounter's, recording a bind mount.
func (m *Mounter) MountSensitive(source, target, fstype string, options, sensitive []string) error {
	return m.mount(source, target, options, nil, func() error {
		return m.FakeMounter.MountSensitive(source, target, fstype, options, sensitive)
	})
}

// MountSensitiveWithoutSystemd is the FakeMounter's, recording a bind
// mount.
func (m *Mounter) MountSensitiveWithoutSystemd(source, target, fstype string, options, sensitive []string) error {
	return m.mount(source, target, options, nil, func() error {
		return m.FakeMounter.MountSensitiveWithoutSystemd(source, target, fstype, options, sensitive)
	})
}

// MountSensitiveWithoutSystemdWithMountFlags is the FakeMounter's,
// recording a bind mount and its flags.
func (m *Mounter) MountSensitiveWithoutSystemdWithMountFlags(source, target, fstype string, options, sensitive, flags []string) error {
	return m.mount(source, target, options, flags, func() error {
		return m.FakeMounter.MountSensitiveWithoutSystemdWithMountFlags(source, target, fstype, options, sensitive, flags)
	})
}

// mount runs do and, when options ask for a bind mount, records what it
// binds: the file source names now, following symlinks as mount(2) does
// (a /proc/{pid}/fd/{n} source names the file open as the descriptor).
func (m *Mounter) mount(source, target string, options, flags []string, do func() error) error {
	if !slices.Contains(options, "bind") {
		return do()
	}
	var st syscall.Stat_t
	if err := syscall.Stat(source, &st); err != nil {
		return fmt.Errorf("fake bind mount of %s: %w", source, err)
	}
	file := source
	if l, err := os.Readlink(source); err == nil && filepath.IsAbs(l) {
		file = l
	}
	if err := do(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.binds[key(target)] = bind{Source: source, File: file, Dev: st.Dev, Ino: st.Ino, Flags: slices.Clone(flags)}
	return nil
}

// Unmount is the FakeMounter's, forgetting the bind mount at target.
func (m *Mounter) Unmount(target string) error {
	if err := m.FakeMounter.Unmount(target); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.binds, key(target))
	return nil
}

// Bound returns the bind mount at target, if there is one.
func (m *Mounter) Bound(target string) (bind, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.binds[key(target)]
	return b, ok
}

// BoundFile implements subpath.BindRecorder: the device and inode of the
// file bound at target.
func (m *Mounter) BoundFile(target string) (dev, ino uint64, ok bool) {
	b, ok := m.Bound(target)
	return b.Dev, b.Ino, ok
}

// key is the name the FakeMounter keeps a mount point under: target with
// its symlinks resolved, when it exists.
func key(target string) string {
	if p, err := filepath.EvalSymlinks(target); err == nil {
		return p
	}
	return filepath.Clean(target)
}
