package hostpath

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/step"
)

// The modes the kubelet creates a DirectoryOrCreate's directories and a
// FileOrCreate's file with, before the process's umask.
const (
	dirMode  fs.FileMode = 0o755
	fileMode fs.FileMode = 0o644
)

// errUnknownFileType is the kubelet's error for a file that is none of the
// types a hostPath can ask for (a FIFO, say).
var errUnknownFileType = errors.New("only recognise file, directory, socket, block device and character device")

// typeError is a failed type check, worded as the kubelet words it.
type typeError struct {
	Path string
	// Expected is the type wanted, as the kubelet names it ("directory",
	// "socket file", ...).
	Expected string
	// Found is the type found; "" when it could not be told (Err says why).
	Found v1.HostPathType
	Err   error
}

func (e *typeError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("hostPath type check failed, %s is not a %s, unable to determine its type: %v", e.Path, e.Expected, e.Err)
	}
	return fmt.Sprintf("hostPath type check failed: %s is not a %s, it's a %s", e.Path, e.Expected, e.Found)
}

func (e *typeError) Unwrap() error { return e.Err }

// notExistError is the cause of a type check on a path that does not
// exist, worded as the kubelet words it; it wraps the stat error
// (errors.Is(err, fs.ErrNotExist) holds).
type notExistError struct {
	path string
	err  error
}

func (e *notExistError) Error() string { return fmt.Sprintf("path %q does not exist", e.path) }
func (e *notExistError) Unwrap() error { return e.err }

// fileType classifies a file mode as the kubelet does (hostutil's
// GetFileType), naming the type as the hostPath types do.
func fileType(mode fs.FileMode) (v1.HostPathType, error) {
	switch {
	case mode.IsDir():
		return v1.HostPathDirectory, nil
	case mode.IsRegular():
		return v1.HostPathFile, nil
	case mode&fs.ModeSocket != 0:
		return v1.HostPathSocket, nil
	case mode&fs.ModeDevice != 0 && mode&fs.ModeCharDevice != 0:
		return v1.HostPathCharDev, nil
	case mode&fs.ModeDevice != 0:
		return v1.HostPathBlockDev, nil
	}
	return "", errUnknownFileType
}

// typeAt returns the type of what path names, following symlinks as the
// kubelet's stat does.
func (p *plugin) typeAt(path string) (v1.HostPathType, error) {
	fi, err := p.stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", &notExistError{path: path, err: err}
	}
	if err != nil {
		return "", err
	}
	return fileType(fi.Mode())
}

// check is the kubelet's type check of a host path (checkType): an unset
// type checks nothing; DirectoryOrCreate and FileOrCreate make what is
// missing; then what path names must be of the type asked for.
func (p *plugin) check(path string, t v1.HostPathType) error {
	var want v1.HostPathType
	var expected string
	switch t {
	case v1.HostPathUnset:
		return nil
	case v1.HostPathDirectoryOrCreate:
		if err := p.makeIfMissing(path, p.mkdirAll); err != nil {
			return err
		}
		want, expected = v1.HostPathDirectory, "directory"
	case v1.HostPathDirectory:
		want, expected = v1.HostPathDirectory, "directory"
	case v1.HostPathFileOrCreate:
		if err := p.makeIfMissing(path, p.makeFile); err != nil {
			return err
		}
		want, expected = v1.HostPathFile, "file"
	case v1.HostPathFile:
		want, expected = v1.HostPathFile, "file"
	case v1.HostPathSocket:
		want, expected = v1.HostPathSocket, "socket file"
	case v1.HostPathCharDev:
		want, expected = v1.HostPathCharDev, "character device"
	case v1.HostPathBlockDev:
		want, expected = v1.HostPathBlockDev, "block device"
	default:
		return fmt.Errorf("%s is an invalid volume type", t)
	}
	// After a create too: the kubelet trusts its MkdirAll, which reports
	// success when a dangling symlink is in the way; this check says so.
	found, err := p.typeAt(path)
	if err != nil {
		return &typeError{Path: path, Expected: expected, Err: err}
	}
	if found != want {
		return &typeError{Path: path, Expected: expected, Found: found}
	}
	return nil
}

// makeIfMissing calls create(path) when nothing is at path: stat,
// following symlinks, says it does not exist, or that a parent is not a
// directory (create then says which). Any other stat error is left to the
// type check that follows, which reports it.
func (p *plugin) makeIfMissing(path string, create func(string) error) error {
	if _, err := p.stat(path); !missing(err) {
		return nil
	}
	return create(path)
}

// missing reports whether err, a stat error, says nothing is there.
func missing(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR)
}

// mkdirAll makes the directory path and its missing parents with the
// kubelet's mode (less the umask, as os.MkdirAll), following symlinks in
// the parents that exist, each directory announced to the step hook before
// it is made. A directory made by someone else in the meantime is fine;
// anything else in the way is an error.
func (p *plugin) mkdirAll(path string) error {
	var absent []string
	for dir := filepath.Clean(path); ; dir = filepath.Dir(dir) {
		fi, err := p.stat(dir)
		if err == nil {
			if !fi.IsDir() {
				return &fs.PathError{Op: "mkdir", Path: dir, Err: unix.ENOTDIR}
			}
			break
		}
		if !missing(err) {
			return err
		}
		absent = append(absent, dir)
		if parent := filepath.Dir(dir); parent == dir {
			break
		}
	}
	for i := len(absent) - 1; i >= 0; i-- {
		dir := absent[i]
		if err := p.steps.Take(step.Mkdir, dir); err != nil {
			return fmt.Errorf("mkdir %s: %w", dir, err)
		}
		err := os.Mkdir(dir, dirMode)
		if errors.Is(err, fs.ErrExist) {
			if fi, serr := p.stat(dir); serr == nil && fi.IsDir() {
				continue
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// makeFile makes an empty file at path with the kubelet's mode (less the
// umask), in a directory that must exist (the kubelet makes no parent for
// a file). As in the kubelet, a dangling symlink at path is followed: the
// file is made where it points. Opened without blocking and without
// taking a terminal, in case something else than a file appeared there
// since the check.
func (p *plugin) makeFile(path string) error {
	if err := p.steps.Take(step.Create, path); err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|unix.O_NONBLOCK|unix.O_NOCTTY, fileMode)
	if err != nil {
		return err
	}
	return f.Close()
}
