// Package rootfs confines file-system work to one directory tree, the
// root: nodevol's {root} (the kubelet's /var/lib/kubelet). Every path is
// reached from a handle on the root directory without following a symlink
// in any component below the root, so that nothing nodevol creates, lists,
// reads, writes or removes can be outside it, whatever a symlink planted
// under the root points to. A component that is a symlink, or that is not
// a directory where one is needed, fails the operation with a *PathError
// naming it (errors.Is(err, ErrSymlink), errors.Is(err, ErrNotDir)).
//
// Paths are resolved with openat2(2) and RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS
// where the kernel has it (Linux 5.6 and later), and otherwise (ENOSYS, or a
// seccomp filter that refuses it) by a walk that opens one component at a
// time with O_NOFOLLOW from the directory opened before. Components above
// the root (in the root's own path) are followed as usual.
//
// What is left, and cannot be closed from here: a path that must be given
// to another process (a CSI driver, mount(8), losetup) or to a system call
// that takes a path (mount(2)) is checked with Verify and then handed over
// as a string; a component swapped for a symlink between the check and the
// use is followed by that process. That is the kubelet's situation too.
// Callers shorten the window by verifying right before each call and again
// before each removal. Directories nodevol holds open while it works could
// also be renamed to outside the root by a process with the rights to do
// so; that needs write access to the root, which only root has.
package rootfs

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nodevol/nodevol/step"
)

var (
	// ErrSymlink is wrapped by the errors for a path component that is a
	// symlink.
	ErrSymlink = errors.New("is a symlink: symlinks under the root are not followed")
	// ErrNotDir is wrapped by the errors for a path component that is not
	// a directory where a directory is needed.
	ErrNotDir = errors.New("is not a directory")
	// ErrOutside is wrapped by the errors for a path that is not under the
	// root.
	ErrOutside = errors.New("is not under the root")
	// ErrNotRemovable is wrapped by Remove's error for what Remove does not
	// remove: anything that is not a regular file or a directory.
	ErrNotRemovable = errors.New("is neither a regular file nor a directory: not removed")
)

// PathError is the error of an operation refused because of a path
// component, or failed on one.
type PathError struct {
	// Op is the operation: "mkdir", "open", "remove", ...
	Op string
	// Path is the path the operation was on (absolute).
	Path string
	// Component is the path of the component at fault (absolute; a prefix
	// of Path, or Path itself).
	Component string
	// Err is the cause: ErrSymlink, ErrNotDir, or a system error.
	Err error
}

func (e *PathError) Error() string {
	if e.Component == "" {
		return fmt.Sprintf("%s %s: %v", e.Op, e.Path, e.Err)
	}
	return fmt.Sprintf("%s %s: %s %v", e.Op, e.Path, e.Component, e.Err)
}

func (e *PathError) Unwrap() error { return e.Err }

// Root is a directory tree that paths are confined to. A Root from New
// holds no open file: each operation opens the root directory by its path
// (following symlinks above it, so a root that is itself a symlink works)
// and resolves the rest from there. A Root from Hold resolves from the one
// handle Hold opened instead. Safe for concurrent use.
type Root struct {
	path string
	// steps sees each change before it is made (WithSteps).
	steps step.Hook
	// fd is the root directory Hold opened (O_PATH), when held is set.
	fd   int
	held bool
}

// New returns the Root at path, made absolute. The directory need not exist
// yet: MkdirAll creates it.
func New(path string) (*Root, error) {
	if path == "" {
		return nil, errors.New("rootfs: empty root path")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("rootfs: %w", err)
	}
	return &Root{path: abs}, nil
}

// WithSteps returns a Root on the same directory whose changes (a
// directory made, a file created or written, a temporary file renamed, an
// entry removed, a symlink made) are each first shown to h (package step):
// an error from h is returned in place of the change, which is not made.
// Reads are not shown. A nil h shows nothing.
// On a held Root (Hold) it returns a Root on the same handle, valid until
// that Root is closed.
func (r *Root) WithSteps(h step.Hook) *Root {
	return &Root{path: r.path, steps: h, fd: r.fd, held: r.held}
}

// Hold opens the root directory once, by its path, and returns a Root
// that resolves every name of its operations from that handle, until
// Close: one open and one close of the root for a whole operation (a
// stage, a publish, a teardown) instead of one per call. A file system
// mounted on the root after Hold is not seen through the held Root, only
// through a later Hold (or r itself): hold the root for the length of one
// operation, never for the life of the process. Nothing else changes: no
// symlink below the root is followed. While held, the handle keeps the
// file system the root is on busy, as any open file on it does. Calling
// Hold on a held Root opens the root afresh.
func (r *Root) Hold() (*Root, error) {
	fd, err := unix.Open(r.path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &PathError{Op: "open", Path: r.path, Component: r.path, Err: err}
	}
	return &Root{path: r.path, steps: r.steps, fd: fd, held: true}, nil
}

// HoldIfPresent is Hold for one operation's work, with the function that
// ends the hold; a root that does not exist yet is not held: r itself is
// returned, whose calls make the root as they need it, with a release that
// does nothing.
func (r *Root) HoldIfPresent() (*Root, func(), error) {
	h, err := r.Hold()
	if errors.Is(err, fs.ErrNotExist) {
		return r, func() {}, nil
	}
	if err != nil {
		return nil, nil, err
	}
	return h, func() { _ = h.Close() }, nil
}

// Close releases the handle of a Root from Hold, which must not be used
// afterwards (nor any Root WithSteps made from it). It does nothing on a
// Root from New. It is not safe to call while the Root is in use.
func (r *Root) Close() error {
	if !r.held {
		return nil
	}
	r.held = false
	return unix.Close(r.fd)
}

// take asks the root's hook whether the change op of full may be made.
func (r *Root) take(op step.Op, full string) error {
	if err := r.steps.Take(op, full); err != nil {
		return &PathError{Op: string(op), Path: full, Err: err}
	}
	return nil
}

// change makes a change to name's last component: fn, given name's
// parent directory (dirFd), base name and absolute path, once the root's
// hook has allowed the change as op s. op names the operation in errors.
func (r *Root) change(op string, s step.Op, name string, fn func(dirFd int, base, full string) error) error {
	dirFd, base, full, err := r.parent(op, name)
	if err != nil {
		return err
	}
	defer r.releaseRoot(dirFd)
	if err := r.take(s, full); err != nil {
		return err
	}
	return fn(dirFd, base, full)
}

// Path returns the root's absolute path.
func (r *Root) Path() string { return r.path }

// Join returns the absolute path of name, which is relative to the root or
// absolute under it (see Rel). It checks nothing on disk.
func (r *Root) Join(name string) (string, error) {
	rel, err := r.Rel(name)
	if err != nil {
		return "", err
	}
	return filepath.Join(r.path, rel), nil
}

// Rel returns name relative to the root, "." for the root itself. name is
// either relative to the root or absolute and, once cleaned, lexically
// under the root; a relative name must not climb out with "..". Every
// method of Root takes names in these two forms.
func (r *Root) Rel(name string) (string, error) {
	if name == "" {
		return "", &PathError{Op: "resolve", Path: name, Err: errors.New("empty path")}
	}
	if filepath.IsAbs(name) {
		rel, err := filepath.Rel(r.path, filepath.Clean(name))
		if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
			return "", &PathError{Op: "resolve", Path: name, Err: fmt.Errorf("%w %s", ErrOutside, r.path)}
		}
		return rel, nil
	}
	rel := filepath.Clean(name)
	if rel == ".." || strings.HasPrefix(rel, "../") {
		return "", &PathError{Op: "resolve", Path: filepath.Join(r.path, name), Err: fmt.Errorf("%w %s", ErrOutside, r.path)}
	}
	return rel, nil
}

// split returns name's components below the root (none for the root) and
// its absolute path.
func (r *Root) split(op, name string) ([]string, string, error) {
	rel, err := r.Rel(name)
	if err != nil {
		if pe, ok := err.(*PathError); ok {
			pe.Op = op
		}
		return nil, "", err
	}
	if rel == "." {
		return nil, r.path, nil
	}
	return strings.Split(rel, "/"), filepath.Join(r.path, rel), nil
}
