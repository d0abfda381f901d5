package atomicwriter

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodevol/nodevol/internal/fsgroup"
	"github.com/nodevol/nodevol/internal/rootfs"
	"github.com/nodevol/nodevol/step"
)

// Permission bits the writer gives, the kubelet's: directories are
// readable and searchable by all; with an fsGroup everything gets the
// group's read (and search) permission and directories setgid, the
// kubelet's read-only ownership mask for these volumes.
const (
	dirMode      fs.FileMode = 0o755
	groupRead    fs.FileMode = 0o440
	groupDirMask             = 0o550 | fs.ModeSetgid
)

// Options are a Writer's settings.
type Options struct {
	// Steps sees every change before it is made (package step); an error
	// from it stops the Write there. Default: none.
	Steps step.Hook
	// FSGroup, if set, is the pod's fsGroup: the writer gives it every
	// file and directory it writes, the volume's directory and the links
	// it makes, with group read (and search and setgid on directories), as
	// the kubelet's ownership change does for these volumes. Default: the
	// writer's own group and no group bits added.
	FSGroup *int64
	// Now names the timestamped directories. Default time.Now.
	Now func() time.Time
}

// Writer writes payloads into one volume's directory. Its Writes are
// serialized; two Writers (or processes) on one directory must not write at
// once, as with the kubelet's writer.
type Writer struct {
	// root is held on the writer's directory (rootfs.Root.Sub), with the
	// steps hook: every name the writer uses is one there, resolved from
	// that handle.
	root    *rootfs.Root
	steps   step.Hook
	dir     string // ".": the writer's directory, in root
	full    string
	fsGroup *int64
	now     func() time.Time
	mu      sync.Mutex
}

// New returns the Writer of directory dir (relative to root, or absolute
// under it), which must exist and be a directory, not a symlink. The
// Writer holds the directory open, found once, until Close: each of its
// names is then one system call's, and a directory swapped for another
// since is not written to (nor a file system mounted on it later).
func New(root *rootfs.Root, dir string, opts Options) (*Writer, error) {
	rel, err := root.Rel(dir)
	if err != nil {
		return nil, fmt.Errorf("atomic writer: %w", err)
	}
	full, err := root.Join(rel)
	if err != nil {
		return nil, fmt.Errorf("atomic writer: %w", err)
	}
	sub, err := root.WithSteps(opts.Steps).Sub(rel)
	if err != nil {
		return nil, fmt.Errorf("atomic writer for %s: %w", full, err)
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	return &Writer{
		root: sub, steps: opts.Steps,
		dir: ".", full: full, fsGroup: opts.FSGroup, now: now,
	}, nil
}

// Close releases the writer's directory; the Writer must not be used
// afterwards.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.root.Close()
}

// Dir returns the absolute path of the writer's directory.
func (w *Writer) Dir() string { return w.full }

// Write makes the volume's directory hold payload, keyed by path (relative,
// "a/b/c" makes directories a and a/b): see the package documentation for
// how. It reports whether it changed what a reader sees: a new version
// published, a user-visible link made or removed. A payload equal to what
// is there changes nothing (false); the leftovers of an interrupted Write
// are removed either way. An invalid path (ValidatePath), or two paths
// that cannot both be files, is an error before anything is written.
//
// The context is checked before each file of a new version: a Write
// cancelled before the switch leaves the old version visible (the next
// Write removes the half-written one); after the switch it finishes.
// After an error (or a crash) at any step the directory shows the old
// version or the new one, never a mix, and the next Write converges.
func (w *Writer) Write(ctx context.Context, payload map[string]File) (changed bool, err error) {
	clean, paths, err := cleanPayload(payload)
	if err != nil {
		return false, fmt.Errorf("write to volume directory %s: %w", w.full, err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	start := w.now()
	changed, err = w.write(ctx, clean, paths)
	if w.fsGroup != nil && (changed || err != nil) {
		// The kubelet walks the volume to give it the pod's fsGroup after
		// each write, measured as volume_apply_access_control; the writer
		// gives it while it writes: the write stands for the walk.
		fsgroup.Observe(ctx, w.now().Sub(start), err)
	}
	if err != nil {
		return changed, fmt.Errorf("write %d files to volume directory %s: %w", len(paths), w.full, err)
	}
	return changed, nil
}

func (w *Writer) write(ctx context.Context, payload map[string]File, paths []string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	// One listing of the directory serves every question of this Write
	// about its entries: the writer is the directory's only writer.
	list, err := w.list()
	if err != nil {
		return false, err
	}
	cur, err := w.current(list)
	if err != nil {
		return false, err
	}
	upToDate := false
	if cur != "" {
		if upToDate, err = w.holds(cur, payload, paths); err != nil {
			return false, err
		}
	}
	changed, previous := false, ""
	if !upToDate {
		name, err := w.writeVersion(ctx, payload, paths)
		if err != nil {
			return false, err
		}
		if err := w.switchTo(name, list); err != nil {
			return false, err
		}
		previous, cur, changed = cur, name, true
	}
	made, err := w.linkTops(payload, paths, list)
	if err != nil {
		return true, err
	}
	removed, err := w.pruneLinks(paths, list)
	if err != nil {
		return true, err
	}
	if err := w.removeOld(cur, previous, list); err != nil {
		return true, err
	}
	return changed || made || removed, nil
}

// rel returns name (a path in the writer's directory) relative to the root.
func (w *Writer) rel(name string) string { return path.Join(w.dir, name) }

// entries are the writer's directory's entries, by name: their types.
type entries map[string]fs.FileMode

// list lists the writer's directory.
func (w *Writer) list() (entries, error) {
	des, err := w.root.ReadDir(w.dir)
	if err != nil {
		return nil, err
	}
	l := make(entries, len(des))
	for _, e := range des {
		l[e.Name()] = e.Type()
	}
	return l, nil
}

// current returns the name of the timestamped directory ..data points to,
// "" if there is no ..data.
func (w *Writer) current(list entries) (string, error) {
	if _, ok := list[dataDirName]; !ok {
		return "", nil
	}
	target, err := w.root.Readlink(w.rel(dataDirName))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", nil
	case errors.Is(err, unix.EINVAL):
		return "", fmt.Errorf("%s is not a symlink: not written by an atomic writer", path.Join(w.full, dataDirName))
	case err != nil:
		return "", err
	}
	if !isVersionName(target) {
		return "", fmt.Errorf("%s points to %q, not to a timestamped directory beside it", path.Join(w.full, dataDirName), target)
	}
	return target, nil
}

// isVersionName reports whether name may be a timestamped directory's: a
// base name starting with ".." that is none of the writer's other names.
// The kubelet's names (tsLayout and digits) are such names; one of another
// form that ..data points to is read, not refused.
func isVersionName(name string) bool {
	if len(name) <= 2 || name[:2] != ".." || name == dataDirName || name == newDataDirName {
		return false
	}
	for i := range len(name) {
		if name[i] == '/' {
			return false
		}
	}
	return true
}

// isTimestampName reports whether name has the form of the timestamped
// directories the kubelet and this writer make: ..2006_01_02_15_04_05.N.
func isTimestampName(name string) bool {
	if len(name) <= len(tsLayout)+1 || name[len(tsLayout)] != '.' {
		return false
	}
	if _, err := time.Parse(tsLayout, name[:len(tsLayout)]); err != nil {
		return false
	}
	_, err := strconv.ParseUint(name[len(tsLayout)+1:], 10, 64)
	return err == nil
}

// newVersion makes a new timestamped directory, named after the time
// (UTC) to the second and then its nanoseconds (the kubelet puts random
// digits there; both read as the same form), and returns its name.
func (w *Writer) newVersion() (string, error) {
	now := w.now().UTC()
	prefix := now.Format(tsLayout) + "."
	for i := range 1000 {
		name := prefix + fmt.Sprintf("%09d", now.Nanosecond()+i)
		err := w.root.Mkdir(w.rel(name), dirMode)
		if err == nil {
			return name, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return "", err
		}
	}
	return "", fmt.Errorf("no free name for a timestamped directory in %s", w.full)
}
