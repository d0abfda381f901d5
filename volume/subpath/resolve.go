package subpath

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// maxSymlinks bounds the symlinks one resolution follows: the kernel's
// MAXSYMLINKS, so that a loop ends where it ends for a path the kernel
// resolves (ELOOP).
const maxSymlinks = 40

// linkError is the error for a symlink in a subPath that Prepare does not
// follow. It wraps Err and ErrSymlink.
type linkError struct {
	Link, Target string
	Err          error
}

func (e *linkError) Error() string {
	if e.Target == "" {
		return fmt.Sprintf("symlink %s: %v", e.Link, e.Err)
	}
	return fmt.Sprintf("symlink %s -> %q: %v", e.Link, e.Target, e.Err)
}

func (e *linkError) Unwrap() []error { return []error{e.Err, ErrSymlink} }

// walked is the outcome of a walk: the subPath's file, or, when the
// subPath's own last components are missing, the deepest directory that
// exists and the components to create in it.
type walked struct {
	// fd is an O_PATH descriptor of the file, or of the directory to
	// create missing in.
	fd int
	// mode is fd's file type (S_IFMT bits).
	mode uint32
	// path names fd for errors and steps: the volume's path joined with
	// the names walked, every symlink resolved.
	path string
	// missing are the subPath's own trailing components that do not
	// exist (none of them came from a symlink's target).
	missing []string
}

// walker resolves a subPath below the volume's directory, symlinks
// included, the way filepath.EvalSymlinks on the volume's host path
// resolves it for the kubelet, but without leaving the volume: every
// component is opened with O_PATH|O_NOFOLLOW from the directory opened
// before it, a symlink is read from the descriptor it was opened as
// (readlinkat), and ".." steps back to a directory the walk holds open
// instead of asking the kernel for the parent. So nothing outside the
// volume is ever opened, read or even looked up by name (a host
// EvalSymlinks would stat whatever an escaping symlink names, and the
// kernel's ".." of a directory the pod moved meanwhile could lead out of
// the volume), and what the walk ends on is the file it opened, with no
// window between resolving and opening: a component swapped for a symlink
// while the walk runs is read as that symlink and judged like any other.
//
// An absolute target counts as inside when it names the volume by its
// path (Mount.VolumePath, or the directory it resolves to): the kubelet
// resolves such a target on the host and checks that it stays in the
// volume's host path. One that reaches the volume only through another
// symlink on the host is refused, and so is a relative target that climbs
// out of the volume even to come back in: following either would mean
// resolving names outside the volume.
type walker struct {
	volumePath string
	// roots are the absolute paths that name the volume, as components.
	roots [][]string
	// dirs are the directories walked into, dirs[0] the volume's; names
	// their names below it (len(dirs)-1 of them).
	dirs  []int
	names []string
	// read are the symlinks read so far.
	read []readLink
	// afterLink, when set (tests), runs after a symlink was read.
	afterLink func(link string)
}

// newWalker returns a walker from the volume's directory volFd, which it
// duplicates; close it with close.
func newWalker(volFd int, volumePath string, afterLink func(string)) (*walker, error) {
	fd, err := unix.Dup(volFd)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", volumePath, err)
	}
	w := &walker{volumePath: volumePath, dirs: []int{fd}, afterLink: afterLink}
	w.roots = append(w.roots, pathComponents(filepath.Clean(volumePath)))
	// The kernel's name of the directory opened: volumePath with its
	// symlinks resolved, as the kubelet's EvalSymlinks of it.
	buf := make([]byte, unix.PathMax)
	if n, err := unix.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd), buf); err == nil && string(buf[:n]) != filepath.Clean(volumePath) {
		real := string(buf[:n])
		w.roots = append(w.roots, pathComponents(real))
	}
	return w, nil
}

// close closes the directories the walker holds.
func (w *walker) close() {
	for _, fd := range w.dirs {
		_ = unix.Close(fd)
	}
	w.dirs = nil
}

// path is the path of the directory the walk is in, or of name in it.
func (w *walker) path(name ...string) string {
	return filepath.Join(append([]string{w.volumePath}, append(w.names, name...)...)...)
}

// pathComponents splits an absolute path into its components, without
// empty ones and ".".
func pathComponents(p string) []string {
	var out []string
	for _, c := range strings.Split(p, "/") {
		if c != "" && c != "." {
			out = append(out, c)
		}
	}
	return out
}

// part is one component still to walk, and the symlink whose target it
// came from (an index in walker.read), -1 for the subPath's own.
type part struct {
	name string
	from int
}

// readLink is a symlink the walk read.
type readLink struct{ link, target string }

// walk resolves comps (a validated subPath's components) below the
// volume. The walked.fd it returns is the caller's to close.
func (w *walker) walk(comps []string) (walked, error) {
	pending := make([]part, len(comps))
	for i, c := range comps {
		pending[i] = part{name: c, from: -1}
	}
	for len(pending) > 0 {
		p := pending[0]
		pending = pending[1:]
		switch p.name {
		case "", ".":
			continue
		case "..":
			if len(w.names) == 0 {
				return walked{}, w.linkError(p, errEscape)
			}
			_ = unix.Close(w.dirs[len(w.dirs)-1])
			w.dirs, w.names = w.dirs[:len(w.dirs)-1], w.names[:len(w.names)-1]
			continue
		}
		top := w.dirs[len(w.dirs)-1]
		fd, err := unix.Openat(top, p.name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == unix.ENOENT && p.from < 0 {
			return w.missing(append([]part{p}, pending...))
		}
		if err != nil {
			return walked{}, w.linkError(p, fmt.Errorf("%s: %w", w.path(p.name), err))
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			_ = unix.Close(fd)
			return walked{}, fmt.Errorf("%s: %w", w.path(p.name), err)
		}
		mode := st.Mode & unix.S_IFMT
		switch {
		case mode == unix.S_IFLNK:
			pending, err = w.follow(fd, p.name, pending)
			_ = unix.Close(fd)
			if err != nil {
				return walked{}, err
			}
		case mode == unix.S_IFDIR:
			if len(w.path(p.name))-len(w.volumePath) > maxSubPathLength {
				_ = unix.Close(fd)
				return walked{}, w.linkError(p, fmt.Errorf("%s: longer than %d bytes below the volume: %w", w.path(p.name), maxSubPathLength, unix.ENAMETOOLONG))
			}
			w.dirs, w.names = append(w.dirs, fd), append(w.names, p.name)
		case hasComponents(pending):
			_ = unix.Close(fd)
			return walked{}, w.linkError(pending[0], fmt.Errorf("%s: %w", w.path(p.name), unix.ENOTDIR))
		default:
			return walked{fd: fd, mode: mode, path: w.path(p.name)}, nil
		}
	}
	fd, err := unix.Dup(w.dirs[len(w.dirs)-1])
	if err != nil {
		return walked{}, fmt.Errorf("%s: %w", w.path(), err)
	}
	return walked{fd: fd, mode: unix.S_IFDIR, path: w.path()}, nil
}

// linkError is err for p, wrapped in the error naming the symlink p came
// from, if any.
func (w *walker) linkError(p part, err error) error {
	if p.from < 0 {
		return err
	}
	l := w.read[p.from]
	if errors.Is(err, unix.ENOENT) {
		err = fmt.Errorf("%w: %w", errDangling, err)
	}
	return &linkError{Link: l.link, Target: l.target, Err: err}
}

// hasComponents reports whether comps name anything ("" and "." do not).
func hasComponents(comps []part) bool {
	for _, c := range comps {
		if c.name != "" && c.name != "." {
			return true
		}
	}
	return false
}

// missing is the outcome of a walk that found the subPath's own trailing
// components comps missing in the directory it is in.
func (w *walker) missing(comps []part) (walked, error) {
	fd, err := unix.Dup(w.dirs[len(w.dirs)-1])
	if err != nil {
		return walked{}, fmt.Errorf("%s: %w", w.path(), err)
	}
	var create []string
	for _, c := range comps {
		if c.name != "" && c.name != "." {
			create = append(create, c.name)
		}
	}
	return walked{fd: fd, mode: unix.S_IFDIR, path: w.path(), missing: create}, nil
}

// follow reads the symlink open as fd (name c in the walk's directory),
// counting it against maxSymlinks, and returns pending with its target's
// components in front. An absolute target restarts the walk at the
// volume's directory when it names a path in the volume, and is refused
// otherwise.
func (w *walker) follow(fd int, c string, pending []part) ([]part, error) {
	link := w.path(c)
	if len(w.read) == maxSymlinks {
		return nil, &linkError{Link: link, Err: fmt.Errorf("more than %d symlinks followed, a loop: %w", maxSymlinks, unix.ELOOP)}
	}
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(fd, "", buf)
	if err != nil {
		return nil, fmt.Errorf("reading symlink %s: %w", link, err)
	}
	target := string(buf[:n])
	if w.afterLink != nil {
		w.afterLink(link)
	}
	w.read = append(w.read, readLink{link: link, target: target})
	comps := strings.Split(target, "/")
	if filepath.IsAbs(target) {
		rel, ok := w.belowVolume(target)
		if !ok {
			return nil, &linkError{Link: link, Target: target, Err: errEscape}
		}
		for _, fd := range w.dirs[1:] {
			_ = unix.Close(fd)
		}
		w.dirs, w.names = w.dirs[:1], w.names[:0]
		comps = rel
	}
	out := make([]part, 0, len(comps)+len(pending))
	for _, c := range comps {
		out = append(out, part{name: c, from: len(w.read) - 1})
	}
	return append(out, pending...), nil
}

// belowVolume returns the components of the absolute path p below the
// volume's directory, when p names a path in it by one of w.roots.
func (w *walker) belowVolume(p string) ([]string, bool) {
	comps := pathComponents(p)
	for _, root := range w.roots {
		if len(comps) >= len(root) && slices.Equal(comps[:len(root)], root) {
			return comps[len(root):], true
		}
	}
	return nil, false
}

// errDangling is wrapped by the error for a symlink whose target, or a
// directory on the way to it, does not exist: the kubelet fails the same
// way and creates nothing through a symlink.
var errDangling = errors.New("its target does not exist")
