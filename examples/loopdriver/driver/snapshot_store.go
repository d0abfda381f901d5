package driver

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/nodevol/nodevol/internal/fsutil"
)

// snapshotState is one snapshot: a sparse copy of its source volume's
// image, stored as {statedir}/snapshots/{id}.img with {id}.json beside it.
type snapshotState struct {
	Version        int    `json:"version"`
	ID             string `json:"id"`
	Name           string `json:"name"`
	SourceVolumeID string `json:"sourceVolumeID"`
	SizeBytes      int64  `json:"sizeBytes"`
	// CreatedUnixNano is when the copy was made.
	CreatedUnixNano int64 `json:"createdUnixNano"`
}

// snapshotStore keeps snapshot states in memory and on disk, as store
// does for volumes.
type snapshotStore struct {
	dir string // {statedir}/snapshots

	mu    sync.Mutex
	snaps map[string]*snapshotState
}

// openSnapshotStore loads {stateDir}/snapshots; a corrupt or unknown file
// fails the load, naming the file.
func openSnapshotStore(stateDir string) (*snapshotStore, error) {
	dir := filepath.Join(stateDir, "snapshots")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating snapshot directory: %w", err)
	}
	s := &snapshotStore{dir: dir, snaps: map[string]*snapshotState{}}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("reading snapshot directory: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") && strings.Contains(name, ".tmp-") {
			_ = os.Remove(filepath.Join(dir, name)) // a copy a crash interrupted
			continue
		}
		id, ok := strings.CutSuffix(name, ".json")
		if !ok {
			continue
		}
		var sn snapshotState
		path := filepath.Join(dir, name)
		if err := fsutil.ReadJSON(path, &sn); err != nil {
			return nil, fmt.Errorf("loading snapshot state: %w", err)
		}
		switch {
		case sn.Version != stateVersion:
			return nil, fmt.Errorf("loading snapshot state %s: unknown format version %d (this driver reads version %d)", path, sn.Version, stateVersion)
		case sn.ID != id || fsutil.ValidateName("snapshot ID", id) != nil:
			return nil, fmt.Errorf("loading snapshot state %s: holds snapshot ID %q, not %q", path, sn.ID, id)
		case sn.Name == "" || sn.SourceVolumeID == "" || sn.SizeBytes <= 0:
			return nil, fmt.Errorf("loading snapshot state %s: snapshot %s lacks its name, source or size", path, id)
		}
		s.snaps[id] = &sn
	}
	return s, nil
}

func (s *snapshotStore) imagePath(id string) string { return filepath.Join(s.dir, id+".img") }
func (s *snapshotStore) statePath(id string) string { return filepath.Join(s.dir, id+".json") }

func (s *snapshotStore) get(id string) *snapshotState {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sn := s.snaps[id]; sn != nil {
		c := *sn
		return &c
	}
	return nil
}

func (s *snapshotStore) put(sn *snapshotState) error {
	sn.Version = stateVersion
	if err := fsutil.WriteJSONAtomic(s.statePath(sn.ID), sn, 0o600); err != nil {
		return fmt.Errorf("saving state of snapshot %s: %w", sn.ID, err)
	}
	c := *sn
	s.mu.Lock()
	s.snaps[sn.ID] = &c
	s.mu.Unlock()
	return nil
}

// remove deletes the image, then the state file (a crash in between
// leaves a record a retried DeleteSnapshot finishes).
func (s *snapshotStore) remove(id string) error {
	if err := os.Remove(s.imagePath(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("deleting image of snapshot %s: %w", id, err)
	}
	if err := os.Remove(s.statePath(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("deleting state of snapshot %s: %w", id, err)
	}
	s.mu.Lock()
	delete(s.snaps, id)
	s.mu.Unlock()
	return nil
}

// list returns copies of all snapshots, sorted by ID.
func (s *snapshotStore) list() []*snapshotState {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*snapshotState, 0, len(s.snaps))
	for _, sn := range s.snaps {
		c := *sn
		out = append(out, &c)
	}
	slices.SortFunc(out, func(a, b *snapshotState) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Whence values of lseek(2) for sparse files (Linux).
const (
	seekData = 3
	seekHole = 4
)

// copySparse copies the image src to a new file dst of size bytes
// (at least src's size), copying only src's data extents: the holes of a
// sparse image stay holes. It writes a temporary file and renames it, so
// that dst never exists half-copied.
func copySparse(dst, src string, size int64) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := out.Name()
	err = copyExtents(out, in, fi.Size())
	if err == nil {
		err = out.Truncate(max(size, fi.Size()))
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("copying %s: %w", src, err)
	}
	return nil
}

// copyExtents copies the data extents of in (size bytes) to the same
// offsets of out.
func copyExtents(out, in *os.File, size int64) error {
	for off := int64(0); off < size; {
		data, err := in.Seek(off, seekData)
		if errors.Is(err, syscall.ENXIO) {
			return nil // only a hole is left
		}
		if err != nil {
			return err
		}
		hole, err := in.Seek(data, seekHole)
		if err != nil {
			return err
		}
		if _, err := io.Copy(io.NewOffsetWriter(out, data), io.NewSectionReader(in, data, hole-data)); err != nil {
			return err
		}
		off = hole
	}
	return nil
}
