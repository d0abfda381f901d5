package atomicwriter

import (
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
)

// The kubelet's limits on a payload path.
const (
	maxFileNameLength = 255
	maxPathLength     = 4096
)

// Names the writer owns in a volume's directory. Every name starting with
// ".." is reserved: no payload path may start with it.
const (
	dataDirName    = "..data"
	newDataDirName = "..data_tmp"
	// tsLayout is the time part of a timestamped directory's name (UTC); a
	// "." and random decimal digits follow it, as in the kubelet.
	tsLayout = "..2006_01_02_15_04_05"
)

// ValidatePath checks one payload path as the kubelet's writer does, with
// its error texts: not empty, relative, at most 4096 characters, no ".."
// element, no element over 255 characters, not starting with "..". It
// also refuses a path that names the volume's directory itself (".", "a/..").
func ValidatePath(p string) error {
	if p == "" {
		return fmt.Errorf("invalid path: must not be empty: %q", p)
	}
	if path.IsAbs(p) {
		return fmt.Errorf("invalid path: must be relative path: %s", p)
	}
	if len(p) > maxPathLength {
		return fmt.Errorf("invalid path: must be less than or equal to %d characters", maxPathLength)
	}
	items := strings.Split(p, "/")
	for _, item := range items {
		if item == ".." {
			return fmt.Errorf("invalid path: must not contain '..': %s", p)
		}
		if len(item) > maxFileNameLength {
			return fmt.Errorf("invalid path: filenames must be less than or equal to %d characters", maxFileNameLength)
		}
	}
	if strings.HasPrefix(items[0], "..") && len(items[0]) > 2 {
		return fmt.Errorf("invalid path: must not start with '..': %s", p)
	}
	if path.Clean(p) == "." {
		return fmt.Errorf("invalid path: must name a file, not the volume's directory: %s", p)
	}
	return nil
}

// ValidateKeys checks the keys of files that are their own files' names
// (a configMap's or a secret's keys when no items map them to paths): each
// must be one valid file name (ValidatePath, and no "/", which would write
// below the volume's top level). Keys are checked in sorted order, so the
// error names the first invalid one.
func ValidateKeys(files map[string]File) error {
	for _, key := range slices.Sorted(maps.Keys(files)) {
		if strings.Contains(key, "/") {
			return fmt.Errorf("key %q: invalid path: a key is a file name, it must not contain '/'", key)
		}
		if err := ValidatePath(key); err != nil {
			return fmt.Errorf("key %q: %w", key, err)
		}
	}
	return nil
}

// Nested returns the first of sorted paths that another of them lies
// below ("a" and "a/b"), and the first such other path: two payload paths
// that cannot both be files. ok is false when there is none. paths must
// be sorted (slices.Sort); they are compared as given, not cleaned.
func Nested(paths []string) (file, below string, ok bool) {
	// Sorted, a path's descendants follow it among the paths that start
	// with it ("p-x" and "p.x" sort between "p" and "p/x"): look no further
	// than the first path that does not.
	for i, p := range paths {
		for _, q := range paths[i+1:] {
			if strings.HasPrefix(q, p+"/") {
				return p, q, true
			}
			if !strings.HasPrefix(q, p) {
				break
			}
		}
	}
	return "", "", false
}

// errPathConflict is wrapped by cleanPayload's error for two paths that
// cannot both be files.
var errPathConflict = errors.New("conflicting payload paths")

// cleanPayload validates every path of payload and returns the payload
// keyed by the cleaned paths ("a//b/" is "a/b", as in the kubelet), with
// the cleaned paths sorted. Two paths that clean to the same one, or a path
// that is a directory of another ("a" and "a/b"), are an error: the kubelet
// lets one of them win by map order, or fails midway.
func cleanPayload(payload map[string]File) (map[string]File, []string, error) {
	clean := make(map[string]File, len(payload))
	for p, f := range payload {
		if err := ValidatePath(p); err != nil {
			return nil, nil, err
		}
		c := path.Clean(p)
		if _, dup := clean[c]; dup {
			return nil, nil, fmt.Errorf("%w: two paths are %s", errPathConflict, c)
		}
		clean[c] = f
	}
	paths := make([]string, 0, len(clean))
	for p := range clean {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	if p, q, ok := Nested(paths); ok {
		return nil, nil, fmt.Errorf("%w: %s is a file and a directory of %s", errPathConflict, p, q)
	}
	return clean, paths, nil
}

// topLevel returns the first element of cleaned path p: the name of its
// user-visible link.
func topLevel(p string) string {
	top, _, _ := strings.Cut(p, "/")
	return top
}
