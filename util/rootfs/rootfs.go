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
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/nodevol/nodevol/util/step"
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

// Root is a directory tree that paths are confined to. It holds no open
// file: each operation opens the root directory by its path (following
// symlinks above it, so a root that is itself a symlink works) and resolves
// the rest from there. Safe for concurrent use.
type Root struct {
	path string
	// steps sees each change before it is made (WithSteps).
	steps step.Hook
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
func (r *Root) WithSteps(h step.Hook) *Root {
	return &Root{path: r.path, steps: h}
}

// take asks the root's hook whether the change op of full may be made.
func (r *Root) take(op step.Op, full string) error {
	if err := r.steps.Take(op, full); err != nil {
		return &PathError{Op: string(op), Path: full, Err: err}
	}
	return nil
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

// The kernel's openat2, probed once; tests may turn it off.
var (
	openat2Once sync.Once
	openat2OK   bool
	noOpenat2   bool // tests: use the walk
)

func haveOpenat2() bool {
	if noOpenat2 {
		return false
	}
	openat2Once.Do(func() {
		fd, err := unix.Openat2(unix.AT_FDCWD, ".", &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS,
		})
		if err == nil {
			_ = unix.Close(fd)
		}
		// ENOSYS: an older kernel; EPERM: a seccomp filter that does not know
		// it; E2BIG/EINVAL: it does not know the flags.
		openat2OK = err == nil
	})
	return openat2OK
}

// openRoot opens the root directory.
func (r *Root) openRoot(op, full string) (int, error) {
	fd, err := unix.Open(r.path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &PathError{Op: op, Path: full, Component: r.path, Err: err}
	}
	return fd, nil
}

// open opens comps below the root with flags for the last component (the
// intermediate ones must be directories), following no symlink: a last
// component that is a symlink is opened itself (not followed) only with
// O_PATH|O_NOFOLLOW in flags, and is an error otherwise.
func (r *Root) open(op, full string, comps []string, flags int) (int, error) {
	rootFd, err := r.openRoot(op, full)
	if err != nil {
		return -1, err
	}
	defer unix.Close(rootFd)
	return r.openFrom(rootFd, op, full, comps, flags)
}

func (r *Root) openFrom(rootFd int, op, full string, comps []string, flags int) (int, error) {
	flags |= unix.O_CLOEXEC
	if len(comps) == 0 {
		fd, err := unix.Openat(rootFd, ".", flags&^unix.O_NOFOLLOW, 0)
		if err != nil {
			return -1, &PathError{Op: op, Path: full, Component: r.path, Err: err}
		}
		return fd, nil
	}
	if haveOpenat2() {
		how := &unix.OpenHow{Flags: uint64(flags), Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
		for range 8 {
			fd, err := unix.Openat2(rootFd, strings.Join(comps, "/"), how)
			if err == unix.EAGAIN || err == unix.EINTR {
				continue
			}
			if err == unix.ENOENT {
				// With RESOLVE_NO_SYMLINKS a symlink fails with ELOOP and a
				// file where a directory is needed with ENOTDIR, both before
				// the components after them are looked at: ENOENT means a
				// component is missing and nothing else. Not walking again to
				// name it keeps a missing path (the legacy staging path, a
				// record not written yet) as cheap as one failed openat2.
				return -1, &PathError{Op: op, Path: full, Err: err}
			}
			if err != nil {
				return -1, r.diagnose(rootFd, op, full, comps, flags, err)
			}
			return fd, nil
		}
	}
	return r.walk(rootFd, op, full, comps, flags)
}

// walk opens comps one at a time, each with O_NOFOLLOW from the directory
// opened before: no symlink is followed and nothing resolves above rootFd.
func (r *Root) walk(rootFd int, op, full string, comps []string, flags int) (int, error) {
	fd, err := unix.Dup(rootFd)
	if err != nil {
		return -1, &PathError{Op: op, Path: full, Err: err}
	}
	for i, c := range comps {
		f := unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
		if i == len(comps)-1 {
			f = flags | unix.O_NOFOLLOW
		}
		next, err := unix.Openat(fd, c, f, 0)
		if err != nil {
			perr := r.classify(fd, op, full, comps[:i+1], i == len(comps)-1, flags, err)
			_ = unix.Close(fd)
			return -1, perr
		}
		_ = unix.Close(fd)
		fd = next
	}
	return fd, nil
}

// diagnose turns openat2's error into one naming the component at fault,
// walking from rootFd to find it.
func (r *Root) diagnose(rootFd int, op, full string, comps []string, flags int, cause error) error {
	fd, err := unix.Dup(rootFd)
	if err != nil {
		return &PathError{Op: op, Path: full, Err: cause}
	}
	defer func() { _ = unix.Close(fd) }()
	for i, c := range comps {
		last := i == len(comps)-1
		if perr := r.classify(fd, op, full, comps[:i+1], last, flags, nil); perr != nil {
			return perr
		}
		if last {
			break
		}
		next, err := unix.Openat(fd, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			break
		}
		_ = unix.Close(fd)
		fd = next
	}
	return &PathError{Op: op, Path: full, Err: cause}
}

// classify explains why component prefix[len-1] in directory dirFd could
// not be opened (or, with cause nil, whether it can be): it is missing, a
// symlink, or not a directory where one is needed. It returns nil when it
// finds nothing wrong and cause is nil.
func (r *Root) classify(dirFd int, op, full string, prefix []string, last bool, flags int, cause error) error {
	comp := filepath.Join(r.path, strings.Join(prefix, "/"))
	var st unix.Stat_t
	if err := unix.Fstatat(dirFd, prefix[len(prefix)-1], &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &PathError{Op: op, Path: full, Component: comp, Err: err}
	}
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		if last && flags&unix.O_PATH != 0 && flags&unix.O_NOFOLLOW != 0 && cause == nil {
			return nil
		}
		return &PathError{Op: op, Path: full, Component: comp, Err: ErrSymlink}
	case st.Mode&unix.S_IFMT != unix.S_IFDIR && (!last || flags&unix.O_DIRECTORY != 0):
		return &PathError{Op: op, Path: full, Component: comp, Err: ErrNotDir}
	}
	if cause == nil {
		return nil
	}
	return &PathError{Op: op, Path: full, Component: comp, Err: cause}
}

// parent opens the directory that holds name's last component and returns
// it with that component. name must not be the root.
func (r *Root) parent(op, name string) (dirFd int, base, full string, err error) {
	comps, full, err := r.split(op, name)
	if err != nil {
		return -1, "", "", err
	}
	if len(comps) == 0 {
		return -1, "", "", &PathError{Op: op, Path: full, Err: errors.New("not allowed on the root itself")}
	}
	fd, err := r.open(op, full, comps[:len(comps)-1], unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return -1, "", "", err
	}
	return fd, comps[len(comps)-1], full, nil
}

// MkdirAll creates directory name and the missing directories above it
// (the root too) with perm (before umask), as os.MkdirAll does, except that
// every component below the root that exists must be a directory and not a
// symlink: a symlink fails it (ErrSymlink), before anything is created
// through it.
func (r *Root) MkdirAll(name string, perm fs.FileMode) error {
	comps, full, err := r.split("mkdir", name)
	if err != nil {
		return err
	}
	// The common case: it is all there.
	if fd, err := r.open("mkdir", full, comps, unix.O_PATH|unix.O_DIRECTORY); err == nil {
		_ = unix.Close(fd)
		return nil
	}
	if err := os.MkdirAll(r.path, perm); err != nil {
		return &PathError{Op: "mkdir", Path: full, Component: r.path, Err: err}
	}
	fd, err := r.openRoot("mkdir", full)
	if err != nil {
		return err
	}
	defer func() { _ = unix.Close(fd) }()
	for i, c := range comps {
		const dirFlags = unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
		next, err := unix.Openat(fd, c, dirFlags, 0)
		if err == unix.ENOENT {
			if err := r.take(step.Mkdir, filepath.Join(r.path, strings.Join(comps[:i+1], "/"))); err != nil {
				return err
			}
			if err := unix.Mkdirat(fd, c, uint32(perm.Perm())); err != nil && err != unix.EEXIST {
				return &PathError{Op: "mkdir", Path: full, Component: filepath.Join(r.path, strings.Join(comps[:i+1], "/")), Err: err}
			}
			next, err = unix.Openat(fd, c, dirFlags, 0)
		}
		if err != nil {
			return r.classify(fd, "mkdir", full, comps[:i+1], false, 0, err)
		}
		_ = unix.Close(fd)
		fd = next
	}
	return nil
}

// Verify checks that no component of name below the root is a symlink,
// name's last component included, and that every existing component but
// the last is a directory. Missing components are not an error (a driver
// creates its target path; nothing can be below a missing directory). It
// returns name's absolute path, to hand to a driver or a mounter right
// away: see the package documentation for what a path string still allows.
func (r *Root) Verify(name string) (string, error) {
	comps, full, err := r.split("verify", name)
	if err != nil {
		return "", err
	}
	fd, err := r.open("verify", full, comps, unix.O_PATH|unix.O_NOFOLLOW)
	if err == nil {
		var st unix.Stat_t
		err = unix.Fstat(fd, &st)
		_ = unix.Close(fd)
		switch {
		case err != nil:
			return "", &PathError{Op: "verify", Path: full, Err: err}
		case st.Mode&unix.S_IFMT == unix.S_IFLNK:
			return "", &PathError{Op: "verify", Path: full, Component: full, Err: ErrSymlink}
		}
		return full, nil
	}
	if errors.Is(err, fs.ErrNotExist) {
		return full, nil
	}
	return "", err
}

// Lstat returns the FileInfo of name without following any symlink: a
// last component that is a symlink is described itself; a symlink above it
// is an error (ErrSymlink).
func (r *Root) Lstat(name string) (fs.FileInfo, error) {
	return r.stat("lstat", name, true)
}

// Stat is Lstat, except that a last component that is a symlink is an
// error too (ErrSymlink).
func (r *Root) Stat(name string) (fs.FileInfo, error) {
	return r.stat("stat", name, false)
}

func (r *Root) stat(op, name string, linkOK bool) (fs.FileInfo, error) {
	comps, full, err := r.split(op, name)
	if err != nil {
		return nil, err
	}
	fd, err := r.open(op, full, comps, unix.O_PATH|unix.O_NOFOLLOW)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), full)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, &PathError{Op: op, Path: full, Err: err}
	}
	if !linkOK && fi.Mode()&fs.ModeSymlink != 0 {
		return nil, &PathError{Op: op, Path: full, Component: full, Err: ErrSymlink}
	}
	return fi, nil
}

// ReadDir lists directory name, sorted by name, as os.ReadDir does. Its
// entries are not followed: a symlink in it is listed as a symlink.
func (r *Root) ReadDir(name string) ([]fs.DirEntry, error) {
	comps, full, err := r.split("readdir", name)
	if err != nil {
		return nil, err
	}
	fd, err := r.open("readdir", full, comps, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), full)
	defer f.Close()
	entries, err := f.ReadDir(-1)
	slices.SortFunc(entries, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	if err != nil {
		return entries, &PathError{Op: "readdir", Path: full, Err: err}
	}
	return entries, nil
}

// OpenDir opens directory name for reading (its entries, and as a
// directory to resolve further names from with the *at system calls). A
// symlink, the last component included, is an error.
func (r *Root) OpenDir(name string) (*os.File, error) {
	comps, full, err := r.split("open", name)
	if err != nil {
		return nil, err
	}
	fd, err := r.open("open", full, comps, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), full), nil
}

// Open opens regular file name for reading. A symlink (last component
// included) or anything but a regular file is an error; a FIFO does not
// block it.
func (r *Root) Open(name string) (*os.File, error) {
	comps, full, err := r.split("open", name)
	if err != nil {
		return nil, err
	}
	fd, err := r.open("open", full, comps, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), full)
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("is not a regular file (%v)", fi.Mode().Type())
	}
	if err != nil {
		f.Close()
		return nil, &PathError{Op: "open", Path: full, Component: full, Err: err}
	}
	return f, nil
}

// Create creates name as an empty regular file with perm (before umask).
// It fails if anything, a symlink included, is there already
// (errors.Is(err, fs.ErrExist)).
func (r *Root) Create(name string, perm fs.FileMode) error {
	dirFd, base, full, err := r.parent("create", name)
	if err != nil {
		return err
	}
	defer unix.Close(dirFd)
	if err := r.take(step.Create, full); err != nil {
		return err
	}
	fd, err := unix.Openat(dirFd, base, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(perm.Perm()))
	if err != nil {
		return &PathError{Op: "create", Path: full, Component: full, Err: err}
	}
	return unix.Close(fd)
}

// WriteFileInPlace writes data over name's content (creating it with
// perm if it is not there) and cuts it to len(data). It is not atomic: a
// reader racing the writer, or a crash between the write and the cut,
// can see a mix of the old and the new content. Use it where such a mix
// is detected (a JSON decoder refuses it) and harmless, and where
// WriteFileAtomic's rename over an existing file is too slow: ext4 (with
// its default auto_da_alloc) starts writing a file back to disk when it
// replaces another by rename. A symlink as name is refused, as is
// anything but a regular file.
func (r *Root) WriteFileInPlace(name string, data []byte, perm fs.FileMode) error {
	dirFd, base, full, err := r.parent("write", name)
	if err != nil {
		return err
	}
	defer unix.Close(dirFd)
	if err := r.take(step.Write, full); err != nil {
		return err
	}
	fd, err := unix.Openat(dirFd, base, unix.O_CREAT|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, uint32(perm.Perm()))
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			err = ErrSymlink
		}
		return &PathError{Op: "write", Path: full, Component: full, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &PathError{Op: "write", Path: full, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return &PathError{Op: "write", Path: full, Component: full, Err: ErrNotRemovable}
	}
	for off := 0; off < len(data); {
		n, err := unix.Pwrite(fd, data[off:], int64(off))
		if err != nil {
			return &PathError{Op: "write", Path: full, Err: err}
		}
		off += n
	}
	if err := unix.Ftruncate(fd, int64(len(data))); err != nil {
		return &PathError{Op: "write", Path: full, Err: err}
	}
	return nil
}

// WriteFileAtomic writes data to name so that a reader sees the old
// content or the whole new content: it writes a temporary file in the same
// directory and renames it over name (replacing a symlink there, never
// writing through it). name's directory must exist. It does not fsync.
func (r *Root) WriteFileAtomic(name string, data []byte, perm fs.FileMode) error {
	return r.writeFileAtomic(name, data, perm, false)
}

// WriteFileAtomicSync is WriteFileAtomic made durable: the file is
// fsync'ed before the rename and its directory after, so that after a
// crash or power loss name holds the old or the new content, and a
// rename that returned is not undone.
func (r *Root) WriteFileAtomicSync(name string, data []byte, perm fs.FileMode) error {
	return r.writeFileAtomic(name, data, perm, true)
}

func (r *Root) writeFileAtomic(name string, data []byte, perm fs.FileMode, sync bool) (err error) {
	dirFd, base, full, err := r.parent("write", name)
	if err != nil {
		return err
	}
	defer unix.Close(dirFd)
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	tmp := "." + base + ".tmp-" + hex.EncodeToString(rnd[:])
	if r.steps != nil {
		if err := r.take(step.Write, filepath.Join(filepath.Dir(full), tmp)); err != nil {
			return err
		}
	}
	fd, err := unix.Openat(dirFd, tmp, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(perm.Perm()))
	if err != nil {
		return &PathError{Op: "write", Path: full, Err: err}
	}
	f := os.NewFile(uintptr(fd), filepath.Join(filepath.Dir(full), tmp))
	defer func() {
		if err != nil {
			_ = f.Close()
			// The clean-up is a change too: after a refused step (a
			// crash, to the crash-point suite) the temporary file stays.
			if r.take(step.Remove, f.Name()) == nil {
				_ = unix.Unlinkat(dirFd, tmp, 0)
			}
		}
	}()
	if _, err = f.Write(data); err != nil {
		return &PathError{Op: "write", Path: full, Err: err}
	}
	if err = f.Chmod(perm); err != nil {
		return &PathError{Op: "write", Path: full, Err: err}
	}
	if sync {
		if err = f.Sync(); err != nil {
			return &PathError{Op: "write", Path: full, Err: err}
		}
	}
	if err = f.Close(); err != nil {
		return &PathError{Op: "write", Path: full, Err: err}
	}
	if err = r.take(step.Rename, full); err != nil {
		return err
	}
	if err = unix.Renameat(dirFd, tmp, dirFd, base); err != nil {
		return &PathError{Op: "write", Path: full, Err: err}
	}
	if sync {
		// dirFd may be an O_PATH descriptor, which cannot be synced.
		d, err := unix.Openat(dirFd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err == nil {
			err = unix.Fsync(d)
			unix.Close(d)
		}
		if err != nil {
			return &PathError{Op: "write", Path: full, Err: err}
		}
	}
	return nil
}

// Remove removes name if it is a regular file or an empty directory. It
// follows no symlink: a symlink as name or above it is an error
// (ErrSymlink) and nothing is removed, and so is anything else that is not
// a regular file or a directory (ErrNotRemovable). Each call resolves name
// afresh from the root. A missing name is an error for which
// errors.Is(err, fs.ErrNotExist) holds.
func (r *Root) Remove(name string) error { return r.removeEntry(name, removable) }

// RemoveAny removes name whatever it is, except a directory that is not
// empty: a regular file or an empty directory as Remove does, and also a
// symlink (the link itself, never what it points to), a FIFO, a socket or
// a device node. It is for a name nodevol owns and takes back from
// whatever was put there; removing a directory entry never follows it.
// Like Remove it follows no symlink above name, and a missing name is an
// error for which errors.Is(err, fs.ErrNotExist) holds.
func (r *Root) RemoveAny(name string) error {
	return r.removeEntry(name, func(mode uint32) (int, error) {
		if mode == unix.S_IFDIR {
			return unix.AT_REMOVEDIR, nil
		}
		return 0, nil
	})
}

// removable is Remove's rule: an empty directory or a regular file goes; a
// symlink or anything else stays.
func removable(mode uint32) (int, error) {
	switch mode {
	case unix.S_IFDIR:
		return unix.AT_REMOVEDIR, nil
	case unix.S_IFREG:
		return 0, nil
	case unix.S_IFLNK:
		return 0, ErrSymlink
	}
	return 0, ErrNotRemovable
}

// removeEntry removes name's last component if allow, given its type
// (S_IFMT bits, not following a symlink), says how (unlinkat flags).
func (r *Root) removeEntry(name string, allow func(mode uint32) (int, error)) error {
	dirFd, base, full, err := r.parent("remove", name)
	if err != nil {
		return err
	}
	defer unix.Close(dirFd)
	return r.removeAt(dirFd, base, full, allow)
}

// RemoveIn removes the entries names (base names) of directory dir, then
// dir itself, each only if it is a regular file or an empty directory, as
// Remove does; a missing entry or dir is skipped. dir is resolved once, from
// the root, following no symlink, and the entries are removed relative to
// that handle: one resolution for the whole directory rather than one per
// entry, which is most of a volume teardown's file-system work. A symlink as
// dir, above it or among names is an error (ErrSymlink) and nothing through
// it is removed; the first error stops the removals.
func (r *Root) RemoveIn(dir string, names ...string) error {
	parentFd, base, full, err := r.parent("remove", dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(parentFd)
	dirFd, err := unix.Openat(parentFd, base, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	switch {
	case err == unix.ENOENT:
		return nil
	case err != nil:
		comps, _, _ := r.split("remove", dir)
		return r.classify(parentFd, "remove", full, comps, true, unix.O_DIRECTORY, err)
	}
	defer unix.Close(dirFd)
	for _, name := range names {
		if strings.Contains(name, "/") || name == "" || name == "." || name == ".." {
			return &PathError{Op: "remove", Path: filepath.Join(full, name), Err: errors.New("not a base name")}
		}
		if err := r.removeAt(dirFd, name, filepath.Join(full, name), removable); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	if err := r.removeAt(parentFd, base, full, removable); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// removeAt removes entry name of dirFd if allow, given its type (S_IFMT
// bits, not following a symlink), says how (unlinkat flags); full names it
// in errors. Only a removal that allow permits is shown to the root's hook.
func (r *Root) removeAt(dirFd int, name, full string, allow func(mode uint32) (int, error)) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirFd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &PathError{Op: "remove", Path: full, Component: full, Err: err}
	}
	// unlinkat never follows the last component: were it swapped after the
	// check, the new entry itself would go (or the call fail), never what a
	// symlink points to.
	flags, err := allow(st.Mode & unix.S_IFMT)
	if err == nil {
		if err := r.take(step.Remove, full); err != nil {
			return err
		}
		err = unix.Unlinkat(dirFd, name, flags)
	}
	if err != nil {
		return &PathError{Op: "remove", Path: full, Component: full, Err: err}
	}
	return nil
}

// Symlink creates name as a symlink to target (which is stored as it is,
// not resolved). name's directory must exist.
func (r *Root) Symlink(target, name string) error {
	dirFd, base, full, err := r.parent("symlink", name)
	if err != nil {
		return err
	}
	defer unix.Close(dirFd)
	if err := r.take(step.Symlink, full); err != nil {
		return err
	}
	if err := unix.Symlinkat(target, dirFd, base); err != nil {
		return &PathError{Op: "symlink", Path: full, Component: full, Err: err}
	}
	return nil
}

// Readlink returns the target of symlink name. Anything but a symlink is
// an error (EINVAL, as readlink(2) gives).
func (r *Root) Readlink(name string) (string, error) {
	dirFd, base, full, err := r.parent("readlink", name)
	if err != nil {
		return "", err
	}
	defer unix.Close(dirFd)
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirFd, base, buf)
		if err != nil {
			return "", &PathError{Op: "readlink", Path: full, Component: full, Err: err}
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// RemoveLink removes name if it is a symlink (the link, never what it
// points to). Anything else is an error and stays. A missing name is an
// error for which errors.Is(err, fs.ErrNotExist) holds.
func (r *Root) RemoveLink(name string) error {
	return r.removeEntry(name, func(mode uint32) (int, error) {
		if mode != unix.S_IFLNK {
			return 0, errors.New("is not a symlink: not removed")
		}
		return 0, nil
	})
}
