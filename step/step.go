// Package step names the steps by which nodevol changes a node (a
// directory made or removed, a file written or renamed, a symlink made, a
// mount or an unmount, a loop device attached or detached, a CSI call that
// changes a driver's state) and carries the Hook that sees each one just
// before it is taken.
//
// The hook is the seam of the crash-point suite: a test counts the steps of
// an operation and fails every step from the k-th on, which leaves the disk,
// the mount table and the driver exactly as a process killed at that
// instant would, then restarts on them. Because every package that changes
// the node takes its steps through the hook, a step added to the code is
// counted, and so tested, without touching the suite.
package step

import (
	"fmt"

	"k8s.io/mount-utils"
)

// Op is the kind of a step.
type Op string

// The steps' kinds.
const (
	Mkdir      Op = "mkdir"       // a directory created
	Create     Op = "create"      // an empty file created
	Write      Op = "write"       // a file written in place, or an atomic write's temporary file
	Rename     Op = "rename"      // an atomic write's temporary file renamed over its target
	Remove     Op = "remove"      // a file, an empty directory or a symlink removed
	Symlink    Op = "symlink"     // a symlink created
	Mount      Op = "mount"       // a mount
	Unmount    Op = "unmount"     // an unmount
	LoopAttach Op = "loop-attach" // a loop device attached to a file
	LoopDetach Op = "loop-detach" // a loop device detached
	Call       Op = "call"        // a call that changes a CSI driver's (or the API server's) state
)

// Step is one change to the node, named before it is taken.
type Step struct {
	Op Op
	// Path is the path changed (absolute), the mount point, the loop
	// device or its file; for a Call, the method and its target, as
	// "NodeStageVolume /var/lib/kubelet/...".
	Path string
}

func (s Step) String() string { return fmt.Sprintf("%s %s", s.Op, s.Path) }

// Hook is called before each step. A nil Hook takes every step; a Hook
// that returns an error refuses the step: the step is not taken and the
// error is returned in its place (wrapped by the caller).
type Hook func(Step) error

// Take asks h whether step s may be taken: nil when h is nil.
func (h Hook) Take(op Op, path string) error {
	if h == nil {
		return nil
	}
	return h(Step{Op: op, Path: path})
}

// Mounter returns m with h called before each mount and unmount; m itself
// when h is nil.
func Mounter(m mount.Interface, h Hook) mount.Interface {
	if h == nil {
		return m
	}
	return &mounter{Interface: m, hook: h}
}

type mounter struct {
	mount.Interface
	hook Hook
}

func (m *mounter) Mount(source, target, fstype string, options []string) error {
	if err := m.hook.Take(Mount, target); err != nil {
		return err
	}
	return m.Interface.Mount(source, target, fstype, options)
}

func (m *mounter) MountSensitive(source, target, fstype string, options, sensitive []string) error {
	if err := m.hook.Take(Mount, target); err != nil {
		return err
	}
	return m.Interface.MountSensitive(source, target, fstype, options, sensitive)
}

func (m *mounter) MountSensitiveWithoutSystemd(source, target, fstype string, options, sensitive []string) error {
	if err := m.hook.Take(Mount, target); err != nil {
		return err
	}
	return m.Interface.MountSensitiveWithoutSystemd(source, target, fstype, options, sensitive)
}

func (m *mounter) MountSensitiveWithoutSystemdWithMountFlags(source, target, fstype string, options, sensitive, flags []string) error {
	if err := m.hook.Take(Mount, target); err != nil {
		return err
	}
	return m.Interface.MountSensitiveWithoutSystemdWithMountFlags(source, target, fstype, options, sensitive, flags)
}

func (m *mounter) Unmount(target string) error {
	if err := m.hook.Take(Unmount, target); err != nil {
		return err
	}
	return m.Interface.Unmount(target)
}
