package driver

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/nodevol/nodevol/internal/fsutil"
)

// stateVersion is the format version written into every volume state
// file. A file with any other version is refused at start: guessing at a
// format this code does not know could detach or delete the wrong thing.
const stateVersion = 1

// volumeState is everything the driver knows about one volume. It is
// stored as {statedir}/volumes/{id}.json beside the image {id}.img, so
// that a restarted driver picks up exactly where the old one stopped.
type volumeState struct {
	Version       int    `json:"version"`
	ID            string `json:"id"`
	Name          string `json:"name"`
	CapacityBytes int64  `json:"capacityBytes"`
	// Source is what the volume was made from: "snapshot:{id}" or
	// "volume:{id}"; empty for an empty volume.
	Source string `json:"source,omitempty"`
	// MutableParameters are the volume's mutable parameters (see
	// descriptionParameter).
	MutableParameters map[string]string `json:"mutableParameters,omitempty"`
	// Nodes maps each node the volume is controller-published to onto
	// how it was published.
	Nodes map[string]nodePublication `json:"nodes,omitempty"`
	// Stage is set while the volume is staged on this node.
	Stage *stageState `json:"stage,omitempty"`
	// Targets maps each target path the volume is published at on this
	// node onto how it was published there.
	Targets map[string]targetState `json:"targets,omitempty"`
	// Ephemeral is set for an inline ephemeral volume, which its
	// NodePublishVolume made and its NodeUnpublishVolume deletes.
	Ephemeral *ephemeralState `json:"ephemeral,omitempty"`
}

// nodePublication records one ControllerPublishVolume.
type nodePublication struct {
	ReadOnly bool `json:"readOnly,omitempty"`
}

// stageState records one NodeStageVolume.
type stageState struct {
	Path string `json:"path"`
	// Device is the loop device at staging time, for the operator's eyes
	// only: the driver always looks the device up by its backing image,
	// because loop device numbers do not survive a reboot.
	Device string `json:"device"`
	Block  bool   `json:"block,omitempty"`
	FsType string `json:"fsType,omitempty"`
}

// targetState records one NodePublishVolume.
type targetState struct {
	Block    bool   `json:"block,omitempty"`
	ReadOnly bool   `json:"readOnly,omitempty"`
	Mode     string `json:"mode,omitempty"`
}

// clone returns a deep copy, so that callers can change it and store it
// back without racing readers of the stored copy.
func (v *volumeState) clone() *volumeState {
	c := *v
	c.Nodes = maps.Clone(v.Nodes)
	c.Targets = maps.Clone(v.Targets)
	c.MutableParameters = maps.Clone(v.MutableParameters)
	if v.Stage != nil {
		s := *v.Stage
		c.Stage = &s
	}
	if v.Ephemeral != nil {
		e := *v.Ephemeral
		c.Ephemeral = &e
	}
	return &c
}

// store holds the volume states in memory and on disk. It does not
// serialize operations on one volume (the driver's per-volume lock does);
// it only keeps the map and the files consistent with each other.
type store struct {
	dir string // {statedir}/volumes

	mu   sync.Mutex
	vols map[string]*volumeState
}

// openStore creates the volumes directory if needed and loads every
// state file in it. A file that is corrupt, has an unknown version or
// does not match its name fails the whole load, naming the file: starting
// with part of the state would make the driver lie about what exists.
func openStore(stateDir string) (*store, error) {
	dir := filepath.Join(stateDir, "volumes")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating state directory: %w", err)
	}
	s := &store{dir: dir, vols: map[string]*volumeState{}}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("reading state directory: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") && strings.Contains(name, ".tmp-") {
			// A temporary file left by a crash in the middle of an
			// atomic write: the real file is intact.
			_ = os.Remove(filepath.Join(dir, name))
			continue
		}
		id, ok := strings.CutSuffix(name, ".json")
		if !ok {
			continue
		}
		v, err := loadVolume(filepath.Join(dir, name), id)
		if err != nil {
			return nil, err
		}
		s.vols[id] = v
	}
	return s, nil
}

// loadVolume reads and checks one state file.
func loadVolume(path, id string) (*volumeState, error) {
	var v volumeState
	if err := fsutil.ReadJSON(path, &v); err != nil {
		return nil, fmt.Errorf("loading volume state: %w", err)
	}
	switch {
	case v.Version != stateVersion:
		return nil, fmt.Errorf("loading volume state %s: unknown format version %d (this driver reads version %d)", path, v.Version, stateVersion)
	case v.ID != id:
		return nil, fmt.Errorf("loading volume state %s: holds volume ID %q, not %q", path, v.ID, id)
	case v.Name == "":
		return nil, fmt.Errorf("loading volume state %s: volume %s has no name", path, id)
	case v.CapacityBytes <= 0:
		return nil, fmt.Errorf("loading volume state %s: volume %s has capacity %d", path, id, v.CapacityBytes)
	}
	if err := fsutil.ValidateName("volume ID", id); err != nil {
		return nil, fmt.Errorf("loading volume state %s: %w", path, err)
	}
	if v.Stage != nil && !filepath.IsAbs(v.Stage.Path) {
		return nil, fmt.Errorf("loading volume state %s: volume %s staged at relative path %q", path, id, v.Stage.Path)
	}
	if e := v.Ephemeral; e != nil && (!filepath.IsAbs(e.Target) || v.Stage != nil) {
		return nil, fmt.Errorf("loading volume state %s: ephemeral volume %s with target %q is staged or has a relative target", path, id, e.Target)
	}
	for t := range v.Targets {
		if !filepath.IsAbs(t) {
			return nil, fmt.Errorf("loading volume state %s: volume %s published at relative path %q", path, id, t)
		}
	}
	return &v, nil
}

// imagePath is where the image of volume id lives. id must have passed
// validateID.
func (s *store) imagePath(id string) string { return filepath.Join(s.dir, id+".img") }

func (s *store) statePath(id string) string { return filepath.Join(s.dir, id+".json") }

// get returns a copy of the state of volume id, or nil.
func (s *store) get(id string) *volumeState {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.vols[id]
	if v == nil {
		return nil
	}
	return v.clone()
}

// put writes v to disk and then to memory; on error neither changes.
func (s *store) put(v *volumeState) error {
	v.Version = stateVersion
	if err := fsutil.WriteJSONAtomic(s.statePath(v.ID), v, 0o600); err != nil {
		return fmt.Errorf("saving state of volume %s: %w", v.ID, err)
	}
	s.mu.Lock()
	s.vols[v.ID] = v.clone()
	s.mu.Unlock()
	return nil
}

// remove deletes the image and then the state file of volume id. The
// state file goes last so that a crash in between leaves a record that a
// retried DeleteVolume finds and finishes.
func (s *store) remove(id string) error {
	if err := os.Remove(s.imagePath(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("deleting image of volume %s: %w", id, err)
	}
	if err := os.Remove(s.statePath(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("deleting state of volume %s: %w", id, err)
	}
	s.mu.Lock()
	delete(s.vols, id)
	s.mu.Unlock()
	return nil
}

// list returns copies of all volume states, sorted by ID.
func (s *store) list() []*volumeState {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*volumeState, 0, len(s.vols))
	for _, v := range s.vols {
		out = append(out, v.clone())
	}
	slices.SortFunc(out, func(a, b *volumeState) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// NodeState is what the driver has recorded of one volume on its node:
// where it is staged and where it is published. It is the driver's view,
// for tests and operators who compare it with the node's mounts.
type NodeState struct {
	// StagingPath is NodeStageVolume's staging path; "" when not staged.
	StagingPath string
	// Targets are NodePublishVolume's target paths, sorted; empty when
	// not published.
	Targets []string
	// Ephemeral says the volume is an inline ephemeral one, made by
	// NodePublishVolume (its target may not be in Targets yet, if that
	// publish is not done).
	Ephemeral bool
}

// ReadNodeState reads the node state of volume id from a driver's state
// directory (--statedir), as the driver last saved it, from outside the
// driver (which may be running: its writes are atomic). A volume without
// a state file was never created or was deleted: fs.ErrNotExist.
func ReadNodeState(stateDir, id string) (NodeState, error) {
	if err := validateID(id); err != nil {
		return NodeState{}, err
	}
	v, err := loadVolume(filepath.Join(stateDir, "volumes", id+".json"), id)
	if err != nil {
		return NodeState{}, err
	}
	var s NodeState
	if v.Stage != nil {
		s.StagingPath = v.Stage.Path
	}
	s.Targets = slices.Sorted(maps.Keys(v.Targets))
	s.Ephemeral = v.Ephemeral != nil
	return s, nil
}
