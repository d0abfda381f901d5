package projected

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nodevol/nodevol/internal/atomicwriter"
)

// Keys and prefixes of what ResolveSpec stores in spec.Attributes (see the
// package documentation).
const (
	attrResolved = "resolved"
	attrSize     = "sizeBytes"
	attrFSUser   = "fsUser"
	prefixFile   = "file:"
)

// resolved is what ResolveSpec learns from the pod for SetUp.
type resolved struct {
	// size is the tmpfs size in bytes (0: unbounded).
	size int64
	// fsUser is the pod's FSUser.
	fsUser *int64
	// downward are the files of each downwardAPI source, by the source's
	// index.
	downward map[int]map[string]atomicwriter.File
}

// encode returns r as attributes.
func (r resolved) encode() map[string]string {
	attrs := map[string]string{attrResolved: "true", attrSize: strconv.FormatInt(r.size, 10)}
	if r.fsUser != nil {
		attrs[attrFSUser] = strconv.FormatInt(*r.fsUser, 10)
	}
	for i, files := range r.downward {
		for p, f := range files {
			user := ""
			if f.FSUser != nil {
				user = strconv.FormatInt(*f.FSUser, 10)
			}
			attrs[fmt.Sprintf("%s%d:%s", prefixFile, i, p)] = strconv.FormatInt(int64(f.Mode), 8) + ":" + user + ":" + string(f.Data)
		}
	}
	return attrs
}

// decode returns what encode stored in attrs; a spec ResolveSpec did not
// see is an error.
func decode(attrs map[string]string) (resolved, error) {
	if attrs[attrResolved] != "true" {
		return resolved{}, errors.New("the spec was not resolved from the pod: its tmpfs size and downward API files are not known")
	}
	r := resolved{downward: map[int]map[string]atomicwriter.File{}}
	size, err := strconv.ParseInt(attrs[attrSize], 10, 64)
	if err != nil || size < 0 {
		return resolved{}, fmt.Errorf("resolved tmpfs size %q is not a byte count", attrs[attrSize])
	}
	r.size = size
	if u, ok := attrs[attrFSUser]; ok {
		uid, err := strconv.ParseInt(u, 10, 64)
		if err != nil {
			return resolved{}, fmt.Errorf("resolved fsUser %q: %w", u, err)
		}
		r.fsUser = &uid
	}
	for k, v := range attrs {
		rest, ok := strings.CutPrefix(k, prefixFile)
		if !ok {
			continue
		}
		index, p, ok1 := strings.Cut(rest, ":")
		mode, rest, ok2 := strings.Cut(v, ":")
		user, data, ok3 := strings.Cut(rest, ":")
		i, err1 := strconv.Atoi(index)
		m, err2 := strconv.ParseInt(mode, 8, 32)
		if !ok1 || !ok2 || !ok3 || err1 != nil || err2 != nil {
			return resolved{}, fmt.Errorf("resolved file attribute %q is malformed", k)
		}
		f := atomicwriter.File{Data: []byte(data), Mode: int32(m)}
		if user != "" {
			uid, err := strconv.ParseInt(user, 10, 64)
			if err != nil {
				return resolved{}, fmt.Errorf("resolved file attribute %q: user: %w", k, err)
			}
			f.FSUser = &uid
		}
		if r.downward[i] == nil {
			r.downward[i] = map[string]atomicwriter.File{}
		}
		r.downward[i][p] = f
	}
	return r, nil
}
