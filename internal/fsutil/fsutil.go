// Package fsutil holds small file-system helpers shared by nodevol's
// packages: checking names that become path elements, and writing and
// reading the JSON metadata files (vol_data.json) the kubelet also uses.
package fsutil

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/nodevol/nodevol/internal/rootfs"
)

// MaxNameLength is the longest name ValidateName accepts: the longest
// Kubernetes object name (a DNS subdomain) and comfortably below the 255
// bytes most file systems allow for one path element.
const MaxNameLength = 253

// MaxJSONSize is the largest file ReadJSON reads. Metadata files are a few
// hundred bytes; anything bigger is not one of ours.
const MaxJSONSize = 1 << 20

// ValidateName checks that name can be used as one element of a path: it
// is not empty, not "." or "..", holds no "/" and no NUL byte, and is at most
// MaxNameLength bytes long. kind says what the name is ("driver name",
// "pod UID", "spec name") and is quoted in the error. A name that passes,
// joined to a directory, names an entry directly inside that directory.
func ValidateName(kind, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("invalid %s: must not be empty", kind)
	case name == "." || name == "..":
		return fmt.Errorf("invalid %s %q: must not be %q", kind, name, name)
	case len(name) > MaxNameLength:
		return fmt.Errorf("invalid %s %q: longer than %d bytes", kind, name[:32]+"...", MaxNameLength)
	case strings.ContainsRune(name, '/'):
		return fmt.Errorf("invalid %s %q: must not contain %q", kind, name, "/")
	case strings.IndexByte(name, 0) >= 0:
		return fmt.Errorf("invalid %s %q: must not contain a NUL byte", kind, name)
	}
	return nil
}

// WriteJSONAtomic writes v as JSON to path so that a reader sees either
// the old content or the whole new content, never a partial file: it
// writes a temporary file in the same directory and renames it over path.
// The directory must exist. It does not fsync: the files it writes are
// small metadata on the mount hot path, where two fsyncs cost more than the
// CSI calls; ext4 (auto_da_alloc) flushes a file replaced by rename before
// the rename commits, and readers treat a missing or corrupt file as an
// error, not as "not mounted".
func WriteJSONAtomic(path string, v any, perm os.FileMode) (err error) {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding %s: %w", path, err)
	}
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(data); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err = tmp.Chmod(perm); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err = tmp.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// WriteJSONAtomicIn is WriteJSONAtomic confined to root r: name is
// relative to r or absolute under it, and no symlink below r is followed,
// name's last component included (a symlink there is replaced, not written
// through; see rootfs.Root.WriteFileAtomic).
func WriteJSONAtomicIn(r *rootfs.Root, name string, v any, perm os.FileMode) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding %s: %w", name, err)
	}
	if err := r.WriteFileAtomic(name, data, perm); err != nil {
		return fmt.Errorf("writing %s: %w", name, err)
	}
	return nil
}

// ErrCorrupt is wrapped by ReadJSON when a file exists but does not hold
// valid JSON for v (a torn write by an older writer, a hand edit, junk).
var ErrCorrupt = errors.New("corrupt JSON file")

// ReadJSON decodes the JSON file at path into v. A missing file gives an
// error for which errors.Is(err, fs.ErrNotExist) holds; a file that is not
// valid JSON, holds more than one value or is larger than MaxJSONSize gives
// an error wrapping ErrCorrupt. Both name the file.
func ReadJSON(path string, v any) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	defer f.Close()
	return decodeJSON(path, f, v)
}

// ReadJSONIn is ReadJSON confined to root r: name is relative to r or
// absolute under it, and no symlink below r is followed, name's last
// component included (a symlink gives an error wrapping rootfs.ErrSymlink).
func ReadJSONIn(r *rootfs.Root, name string, v any) error {
	f, err := r.Open(name)
	if err != nil {
		return fmt.Errorf("reading %s: %w", name, err)
	}
	defer f.Close()
	return decodeJSON(name, f, v)
}

func decodeJSON(path string, f io.Reader, v any) error {
	data, err := io.ReadAll(io.LimitReader(f, MaxJSONSize+1))
	if err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	if len(data) > MaxJSONSize {
		return fmt.Errorf("reading %s: %w: larger than %d bytes", path, ErrCorrupt, MaxJSONSize)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("reading %s: %w: %v", path, ErrCorrupt, err)
	}
	return nil
}
