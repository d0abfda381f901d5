// Package poddir removes the directory a gone pod leaves under the root,
// {root}/pods/{uid}, as the kubelet's housekeeping removes an orphaned
// pod's directory (cleanupOrphanedPodDirs), without its risks: nothing is
// removed through a mount or a symlink, and nothing that may hold data is
// removed on a guess.
//
// What goes: empty directories (the volumes/, volume-subpaths/,
// volumeDevices/, plugins/ and containers/ trees a pod's volumes and
// containers leave), symlinks (as links: what they point to is never
// looked at), and the files nodevol or the kubelet write there and nothing
// else reads once the pod is gone: etc-hosts, the containers' termination
// message files (containers/{container}/{id}), emptyDir's ready files
// (plugins/kubernetes.io~empty-dir/{volume}/ready) and the empty files a
// file subPath is bind-mounted on (volume-subpaths/{volume}/{container}/{index}).
//
// What stays: anything else (a file left in a volume directory, a
// vol_data.json, a socket, a device node), and every mount point, which is
// neither crossed nor removed. A mount point anywhere in the directory
// stops the removal before anything is removed. Where something stays, its
// directories and the pod directory stay too, and the error (*KeptError)
// names each thing kept and why. The kubelet removes the files it does not
// know outside volumes/; nodevol keeps them, so a directory the kubelet
// would remove may stay here, but only with a file in it that the error
// names.
//
// Every path is resolved afresh from the root by package rootfs, which
// follows no symlink below the root. A mount made inside the pod directory
// while Remove runs is not entered by a removal of a directory (rmdir of a
// mount point fails with EBUSY, and so does unlink of a file bind-mounted
// on), but a file of one of the names above could be removed from inside a
// mount made after its directory was checked: the caller ensures that
// nothing of the pod is mounted any more, nor will be.
package poddir

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strings"
	"syscall"

	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/internal/fsutil"
	"github.com/nodevol/nodevol/internal/rootfs"
)

var (
	// ErrMountPoint is the reason for a mount point kept: something is
	// mounted there (a file system or a bind mount); it is neither entered
	// nor removed.
	ErrMountPoint = errors.New("is a mount point: not entered, not removed")
	// ErrNotOurs is the reason for a file kept: it is not an empty
	// directory, a symlink or a file nodevol or the kubelet writes there,
	// so it may hold data.
	ErrNotOurs = errors.New("is not a file nodevol or the kubelet writes there: it may hold data, not removed")
)

// Request says which pod directory Remove removes.
type Request struct {
	// Root is the kubelet root the pod directory is under (pods/{Pod}).
	Root *rootfs.Root
	// Pod is the pod's UID: one path component.
	Pod types.UID
	// IsMountPoint, if set, says whether an absolute path is a mount
	// point, from the node's mount table (read once for the call): a mount
	// the kernel does not mark (before Linux 5.8), or one a fake mounter
	// holds. Unset: the kernel's word and device numbers only.
	IsMountPoint func(path string) bool
}

// Kept is one thing Remove left, and why.
type Kept struct {
	// Path is its absolute path.
	Path string
	// Reason is ErrMountPoint, ErrNotOurs, or the error that stopped its
	// removal.
	Reason error
}

// KeptError is Remove's error when the pod directory stays: it names what
// was kept. errors.Is(err, ErrMountPoint) (or ErrNotOurs) holds when one of
// the reasons is that.
type KeptError struct {
	// Pod is the pod's UID; Dir the absolute path of its directory.
	Pod types.UID
	Dir string
	// Kept is what stayed, in the order found (depth first, by name).
	Kept []Kept
	// Untouched is set when nothing was removed: a mount point was found
	// before anything was.
	Untouched bool
}

func (e *KeptError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "pod %s: directory %s kept", e.Pod, e.Dir)
	if e.Untouched {
		b.WriteString(" untouched")
	}
	for i, k := range e.Kept {
		sep := ": "
		if i > 0 {
			sep = "; "
		}
		fmt.Fprintf(&b, "%s%s %v", sep, k.Path, k.Reason)
	}
	return b.String()
}

// Unwrap returns the reasons.
func (e *KeptError) Unwrap() []error {
	out := make([]error, len(e.Kept))
	for i, k := range e.Kept {
		out[i] = k.Reason
	}
	return out
}

// Remove removes pod directory pods/{req.Pod} and what is in it, as the
// package documentation says: what may hold data and every mount point
// stay, with the directories above them, and the error (*KeptError) names
// them; any mount point stops it before it removes anything. The caller
// must know that no volume of the pod is mounted any more, nor will be. A
// missing directory is not an error; a symlink in its place is removed as
// a link. No symlink below the root is followed (package rootfs).
func Remove(ctx context.Context, req Request) error {
	if err := fsutil.ValidateName("pod UID", string(req.Pod)); err != nil {
		return fmt.Errorf("removing the directory of pod %s: %w", req.Pod, err)
	}
	dir := path.Join("pods", string(req.Pod))
	abs, err := req.Root.Join(dir)
	if err != nil {
		return fmt.Errorf("removing the directory of pod %s: %w", req.Pod, err)
	}
	fi, err := req.Root.Lstat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("removing the directory of pod %s: %w", req.Pod, err)
	case fi.Mode()&fs.ModeSymlink != 0:
		if err := req.Root.RemoveLink(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing the directory of pod %s: %w", req.Pod, err)
		}
		return nil
	case !fi.IsDir():
		return &KeptError{Pod: req.Pod, Dir: abs, Kept: []Kept{{Path: abs, Reason: ErrNotOurs}}, Untouched: true}
	}
	w := &walker{ctx: ctx, req: req, dev: fi.Sys().(*syscall.Stat_t).Dev}
	// First find every mount point, removing nothing: a mount below says
	// that something of the pod is still in use.
	if w.mounted(dir, abs, fi) {
		w.keep(abs, ErrMountPoint)
	} else {
		w.walk(dir, nil)
	}
	if len(w.kept) > 0 {
		return &KeptError{Pod: req.Pod, Dir: abs, Kept: w.kept, Untouched: true}
	}
	w.remove = true
	if w.walk(dir, nil) {
		if err := req.Root.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			w.keep(abs, err)
		}
	}
	if len(w.kept) > 0 {
		return &KeptError{Pod: req.Pod, Dir: abs, Kept: w.kept}
	}
	return nil
}

// walker goes through a pod directory depth first: while remove is false
// it only looks for mount points, then it removes.
type walker struct {
	ctx    context.Context
	req    Request
	dev    uint64 // the pod directory's device
	remove bool
	kept   []Kept
}

func (w *walker) keep(p string, reason error) { w.kept = append(w.kept, Kept{Path: p, Reason: reason}) }

// walk goes through directory dir (relative to the root; parts are its
// components below the pod directory) and reports whether everything in
// it went (or, while looking only, whether no mount point is in it).
func (w *walker) walk(dir string, parts []string) bool {
	abs, _ := w.req.Root.Join(dir)
	if err := w.ctx.Err(); err != nil {
		w.keep(abs, err)
		return false
	}
	entries, err := w.req.Root.ReadDir(dir)
	if err != nil {
		w.keep(abs, err)
		return false
	}
	empty := true
	for _, e := range entries {
		if !w.entry(path.Join(dir, e.Name()), append(parts[:len(parts):len(parts)], e.Name())) {
			empty = false
		}
	}
	return empty
}

// entry handles one entry, name (relative to the root; parts below the
// pod directory), and reports whether it went (or, while looking only,
// whether no mount point is at or below it).
func (w *walker) entry(name string, parts []string) bool {
	abs, _ := w.req.Root.Join(name)
	fi, err := w.req.Root.Lstat(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return true
	case err != nil:
		w.keep(abs, err)
		return false
	case fi.Mode()&fs.ModeSymlink != 0:
		// A link holds no data; it is removed itself, never followed.
		return w.removed(abs, w.req.Root.RemoveLink, name)
	case w.mounted(name, abs, fi):
		w.keep(abs, ErrMountPoint)
		return false
	case fi.IsDir():
		if !w.walk(name, parts) {
			return false
		}
		return w.removed(abs, w.req.Root.Remove, name)
	case !w.remove:
		return true
	case fi.Mode().IsRegular() && ours(parts, fi.Size()):
		return w.removed(abs, w.req.Root.Remove, name)
	}
	w.keep(abs, ErrNotOurs)
	return false
}

// removed removes name with rm, once removing; a failure keeps it.
func (w *walker) removed(abs string, rm func(string) error, name string) bool {
	if !w.remove {
		return true
	}
	if err := rm(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		w.keep(abs, err)
		return false
	}
	return true
}

// mounted reports whether name (at abs, described by fi) is a mount point:
// on another device than the pod directory, marked so by the kernel, or in
// the caller's mount table. An error of the check counts as mounted.
func (w *walker) mounted(name, abs string, fi fs.FileInfo) bool {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Dev != w.dev {
		return true
	}
	root, _, err := w.req.Root.MountRoot(name)
	if err != nil && !errors.Is(err, fs.ErrNotExist) || root {
		return true
	}
	return w.req.IsMountPoint != nil && w.req.IsMountPoint(abs)
}

// ours reports whether the regular file at parts (below the pod
// directory), of size bytes, is one that nodevol or the kubelet writes
// there and that nothing reads once the pod is gone.
func ours(parts []string, size int64) bool {
	switch {
	case len(parts) == 1 && parts[0] == "etc-hosts":
		// The kubelet's hosts file for the pod's containers.
		return true
	case len(parts) == 3 && parts[0] == "containers":
		// containers/{container}/{id}: a termination message file.
		return true
	case len(parts) == 4 && parts[0] == "plugins" && parts[1] == "kubernetes.io~empty-dir" && parts[3] == "ready":
		// emptyDir's (and the wrapped volumes') ready file.
		return true
	case len(parts) == 4 && parts[0] == "volume-subpaths" && size == 0:
		// The empty file a file subPath was bind-mounted on.
		return true
	}
	return false
}
