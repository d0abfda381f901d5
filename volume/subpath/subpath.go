// Package subpath makes the kubelet's subPath bind mounts safely, and
// takes them down again: a container runtime or a kubelet fork asks
// Prepare for the path to give the runtime for one volumeMount with a
// subPath, and the volume manager calls CleanVolume before it unpublishes
// a pod volume (CleanPod when the pod's directory goes).
//
// A subPath names a file or directory inside a volume that the pod itself
// can write to. A pod that plants a symlink there must not get a host path
// mounted into its container (CVE-2017-1002101), nor win a race that swaps
// a checked directory for a symlink before the mount (CVE-2021-25741).
// Like the kubelet, Prepare follows the symlinks of a subPath that stay
// inside the volume (a layout such as current -> v2), relative or
// absolute (an absolute target must name a path in the volume's directory,
// as the kubelet resolves it on the host), and refuses the others: a
// target out of the volume, ".." steps above it, a loop, a target that
// does not exist. Unlike the kubelet, which resolves the host path with
// filepath.EvalSymlinks and then opens the result, it resolves inside the
// volume only: it opens one component at a time with O_PATH|O_NOFOLLOW
// from the directory opened before (the volume's to start with), reads a
// symlink from the descriptor it opened, and steps back for ".." to a
// directory it holds open. So nothing outside the volume is opened or even
// looked up by name, and there is no moment between resolving and opening
// for a swap to use: what the walk ends on is the file it opened. (With no
// symlink in the subPath, one openat2 with
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS does the same.) It bind-mounts the
// opened file through its descriptor (/proc/{pid}/fd/{n}, which mount(8)
// does not resolve to a path), and checks afterwards that the mount is the
// file it opened.
//
// On disk it is the kubelet's layout, so that a node can move between the
// kubelet and nodevol: the bind mount of a container's volumeMount number
// {index} is {root}/pods/{uid}/volume-subpaths/{volume}/{container}/{index},
// a directory (mode 0750) for a directory and an empty file (mode 0640) for
// anything else, its parents directories of mode 0750. A missing subPath
// is created in the volume as a directory with the mode of the volume's
// root, as the kubelet creates it.
//
// What it does not do, that the kubelet does: it does not follow a
// symlink whose target leaves the volume's directory even to come back
// into it (../vol/x, or an absolute path that reaches the volume through
// another symlink on the host); it does not expand subPathExpr (the
// caller passes the expanded subPath, which then takes the same path); it
// does not trigger automounts inside the volume; and its errors carry the
// paths, which the kubelet logs but does not put in the pod's events. A
// stale mount (of another file) is detached lazily, a corrupted one
// unmounted, as the kubelet 1.37 does.
//
// In unit tests, mount-utils' FakeMounter makes no mounts, so the check
// after mounting fails (errNotMounted); subpathtest.Mounter is a
// FakeMounter that records what it binds (BindRecorder), on which
// subPaths work.
package subpath

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/internal/fsutil"
	"github.com/nodevol/nodevol/internal/rootfs"
	"github.com/nodevol/nodevol/step"
)

// DirName is the name of a pod's directory of subPath bind mounts,
// {root}/pods/{uid}/volume-subpaths: the kubelet's.
const DirName = "volume-subpaths"

// Limits of a subPath, the kernel's: NAME_MAX bytes for one component and
// PATH_MAX-1 for the whole.
const (
	maxComponentLength = 255
	maxSubPathLength   = 4095
)

// The errors a caller tells apart are the final ones, by what makes them
// final: ErrInvalid (the pod's spec) and ErrSymlink (the volume's content).
// The others are for this package's messages and tests: nothing decides on
// them, so they are unexported.
var (
	// ErrInvalid is wrapped by the errors for a Mount or a name that can
	// never be prepared: a subPath that is empty, absolute, climbs with
	// "..", or exceeds the limits; a name that is not a path element. The
	// error is final: retrying cannot help until the pod changes.
	ErrInvalid = errors.New("invalid")
	// ErrSymlink is wrapped by the errors for a symlink in a subPath
	// that Prepare does not follow: one that leads outside the volume
	// (also errEscape), a loop (also unix.ELOOP), one whose target does
	// not exist (also fs.ErrNotExist). Final until the volume's content
	// changes.
	ErrSymlink = errors.New("a symlink in the subPath is not followed")
	// errEscape is wrapped by the error for a symlink in a subPath whose
	// target is outside the volume: an absolute path that does not name
	// a path in the volume, or ".." steps above the volume's directory.
	errEscape = errors.New("it leads outside the volume")
	// errMismatch is wrapped by the error for a bind mount that is of
	// another file than the one Prepare opened: it was unmounted again.
	// On a real mount that means something mounted over the target, or a
	// mounter that resolved the /proc/{pid}/fd/{n} source as a path (it
	// must pass --no-canonicalize to mount(8)).
	errMismatch = errors.New("the bind mount is not of the opened subPath")
	// errNotMounted is wrapped by the error for a bind mount that the
	// mounter reported made, but that left the target as it was: a
	// mounter that makes no mounts (a fake), which must implement
	// BindRecorder for subPaths to work on it.
	errNotMounted = errors.New("the mounter reported the bind mount made, but nothing is mounted there")
)

// BindRecorder is implemented by a mounter that makes no mounts (a fake,
// for unit tests; package subpathtest has one) so that Prepare can check
// its bind mounts: Prepare asks it what it bound at a target instead of
// looking at the target, where such a mounter leaves the empty directory
// or file Prepare made. A mounter that mounts must not implement it: on
// a real mount the check looks at what the kernel mounted. On a
// BindRecorder, a stale mount is unmounted with Unmount (a fake holds no
// busy mount to detach).
type BindRecorder interface {
	// BoundFile returns the device and inode of the file bound at target
	// by the bind mount made there last and not unmounted: for a source
	// /proc/{pid}/fd/{n}, the file open as that descriptor when it was
	// mounted, as mount(2) binds it. ok is false when nothing is bound
	// at target.
	BoundFile(target string) (dev, ino uint64, ok bool)
}

// Config configures a Manager.
type Config struct {
	// RootDir is nodevol's root, the kubelet's root directory
	// (/var/lib/kubelet): pods/ is under it. Required.
	RootDir string
	// Mounter makes and removes the bind mounts. Required: mount.New("")
	// on a node; in unit tests subpathtest.NewMounter, a FakeMounter that
	// records what it binds (a plain FakeMounter mounts nothing, and
	// Prepare fails with errNotMounted). Its bind mounts must pass mount
	// flags on (mount(8)'s --no-canonicalize): mount-utils' Mounter does.
	Mounter mount.Interface
	// Steps sees every directory or file made or removed, and every mount
	// and unmount, before it is taken (package step). Nil: none is shown.
	Steps step.Hook
}

// Manager prepares and cleans subPath bind mounts. Safe for concurrent
// use: calls for one pod are serialized, calls for different pods run
// side by side. It keeps no state between calls: a new Manager (after a
// restart) finds and cleans what an earlier one, or the kubelet, left.
type Manager struct {
	root    *rootfs.Root
	mounter mount.Interface
	steps   step.Hook
	// fileAt returns the file at target (an absolute path whose
	// components below the root are no symlinks): across a bind mount,
	// the mounted file; on a BindRecorder, the file it bound there.
	fileAt func(target string) (fileID, error)
	// afterOpen, when set (tests), runs after the subPath is opened.
	afterOpen func(fd int)
	// afterLink, when set (tests), runs after a symlink in the subPath
	// was read, before the walk goes on.
	afterLink func(link string)
	// detach lazily unmounts the mount at target (an absolute path whose
	// components below the root are no symlinks): umount2 with
	// MNT_DETACH, or a BindRecorder's Unmount.
	detach func(target string) error
	// locks is shared with the copies held makes.
	locks *podLocks
}

// New returns a Manager for cfg.
func New(cfg Config) (*Manager, error) {
	if cfg.RootDir == "" {
		return nil, fmt.Errorf("subpath: Config.RootDir: %w: empty", ErrInvalid)
	}
	if cfg.Mounter == nil {
		return nil, fmt.Errorf("subpath: Config.Mounter: %w: nil", ErrInvalid)
	}
	root, err := rootfs.New(cfg.RootDir)
	if err != nil {
		return nil, fmt.Errorf("subpath: %w", err)
	}
	m := &Manager{
		root:    root.WithSteps(cfg.Steps),
		mounter: step.Mounter(cfg.Mounter, cfg.Steps),
		steps:   cfg.Steps,
		locks:   &podLocks{},
	}
	m.fileAt, m.detach = m.statFile, detachMount
	if rec, ok := cfg.Mounter.(BindRecorder); ok {
		m.fileAt = func(target string) (fileID, error) {
			if dev, ino, ok := rec.BoundFile(target); ok {
				return fileID{dev: dev, ino: ino}, nil
			}
			return m.statFile(target)
		}
		m.detach = cfg.Mounter.Unmount
	}
	return m, nil
}

// withRootHeld returns a copy of m whose root resolves every name from one handle
// on the root directory, opened now, and the function that closes it: for
// one clean-up, which thus opens the root once instead of once a call (a
// file system mounted on the root later is seen by the next one). A root
// that does not exist is not held: m itself is returned.
func (m *Manager) withRootHeld() (*Manager, func(), error) {
	h, release, err := m.root.HoldIfPresent()
	if err != nil {
		return nil, nil, err
	}
	q := *m
	q.root = h
	return &q, release, nil
}

// Mount is one volumeMount of a container that has a subPath.
type Mount struct {
	// Pod is the pod's UID.
	Pod types.UID
	// Volume names the pod volume as the kubelet names its subPath
	// directory (the kubelet's InnerVolumeSpecName): the PV's name
	// (podvol.VolumeSpec.PVName) for a volume from a claim, the name in
	// pod.spec.volumes otherwise. It is the name of the pod's volume
	// directory, and the name the volume manager passes to CleanVolume;
	// for a claim it is not the pod's name for the volume.
	Volume string
	// VolumePath is where the volume is for the pod (the path
	// GetMountedVolumesForPod reports): the subPath is resolved below it.
	// Symlinks in VolumePath itself are followed, as the kubelet does
	// (a hostPath volume may be one).
	VolumePath string
	// Container is the container's name.
	Container string
	// Index is the volumeMount's index in the container's volumeMounts.
	Index int
	// SubPath is the volumeMount's subPath (subPathExpr already
	// expanded): relative, without "..", components of at most
	// maxComponentLength bytes. "." and a trailing "/" are accepted and
	// cleaned, as the kubelet does. Symlinks in it are followed while
	// they stay in the volume; ".." in their targets is allowed as long
	// as it does not climb above the volume's directory.
	SubPath string
}

// String names the mount in errors and logs.
func (s Mount) String() string {
	return fmt.Sprintf("pod %s volume %q container %q (volumeMount %d) subPath %q", s.Pod, s.Volume, s.Container, s.Index, s.SubPath)
}

// validateNames checks the names that become path elements under the
// root.
func validateNames(pod types.UID, volume string) error {
	if err := fsutil.ValidateName("pod UID", string(pod)); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if err := fsutil.ValidateName("volume name", volume); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// validate checks s and returns its subPath's components below the
// volume (none for "."), cleaned.
func (s Mount) validate() ([]string, error) {
	if err := validateNames(s.Pod, s.Volume); err != nil {
		return nil, err
	}
	if err := fsutil.ValidateName("container name", s.Container); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if s.Index < 0 {
		return nil, fmt.Errorf("%w volumeMount index %d: negative", ErrInvalid, s.Index)
	}
	if s.VolumePath == "" || !filepath.IsAbs(s.VolumePath) {
		return nil, fmt.Errorf("%w volume path %q: not absolute", ErrInvalid, s.VolumePath)
	}
	return splitSubPath(s.SubPath)
}

// splitSubPath checks subPath as the kubelet does (not absolute, no ".."
// component) and against the kernel's limits, and returns its cleaned
// components.
func splitSubPath(subPath string) ([]string, error) {
	bad := func(why string) ([]string, error) {
		return nil, fmt.Errorf("%w subPath %q: %s", ErrInvalid, subPath, why)
	}
	switch {
	case subPath == "":
		return bad("empty")
	case filepath.IsAbs(subPath):
		return bad("must not be an absolute path")
	case len(subPath) > maxSubPathLength:
		return bad(fmt.Sprintf("longer than %d bytes", maxSubPathLength))
	case strings.IndexByte(subPath, 0) >= 0:
		return bad("must not contain a NUL byte")
	}
	for _, c := range strings.Split(subPath, "/") {
		if c == ".." {
			return bad(`must not contain ".."`)
		}
		if len(c) > maxComponentLength {
			return bad(fmt.Sprintf("a component is longer than %d bytes", maxComponentLength))
		}
	}
	clean := filepath.Clean(subPath)
	if clean == "." {
		return nil, nil
	}
	return strings.Split(clean, "/"), nil
}

// Paths under the root, relative to it.

func podSubPathsDir(pod types.UID) string {
	return filepath.Join("pods", string(pod), DirName)
}

func volumeDir(pod types.UID, volume string) string {
	return filepath.Join(podSubPathsDir(pod), volume)
}

func (s Mount) target() string {
	return filepath.Join(volumeDir(s.Pod, s.Volume), s.Container, strconv.Itoa(s.Index))
}

// podLocks serializes the calls for one pod.
type podLocks struct {
	mu    sync.Mutex
	locks map[types.UID]*podLock
}

type podLock struct {
	sync.Mutex
	users int
}

// lock locks pod's lock and returns its unlock.
func (p *podLocks) lock(pod types.UID) func() {
	p.mu.Lock()
	if p.locks == nil {
		p.locks = map[types.UID]*podLock{}
	}
	l := p.locks[pod]
	if l == nil {
		l = &podLock{}
		p.locks[pod] = l
	}
	l.users++
	p.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		p.mu.Lock()
		if l.users--; l.users == 0 {
			delete(p.locks, pod)
		}
		p.mu.Unlock()
	}
}
