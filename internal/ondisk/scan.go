package ondisk

import (
	"errors"
	"io/fs"
	"iter"
	"path"
	"path/filepath"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/internal/fsutil"
	"github.com/nodevol/nodevol/internal/rootfs"
	"github.com/nodevol/nodevol/podvol"
)

// The directories the scan walks, relative to the root.
const (
	podsDir           = "pods"
	blockDevicesDir   = pluginDir + "/" + volumeDevicesDir
	blockPublishDir   = blockDevicesDir + "/publish"
	podBlockLinksDir  = podVolumeDevicesDir
	blockStagingEntry = "staging"
	blockPublishEntry = "publish"
)

// Scanner walks what earlier runs, nodevol's or the kubelet's, left under
// a root, for reconstruction: the pod volume directories, the raw block
// volumes' links, publishes and data directories, the staging directories
// and the records, read into found values. What to do with them is the
// caller's decision.
//
// It follows no symlink below the root (internal/rootfs): a symlink where a
// directory is expected is logged and skipped, so that nothing it points
// to is ever found. It changes nothing but what the format's own writes
// left behind in what it reads: the temporary files of vol_data.json
// writes a crash cut short (RemoveWriteLeftovers) and anything but a
// regular file where a record goes (takeBackRecord). A Scanner remembers
// the records it has read (UnseenRecords lists the others); it is not
// safe for concurrent use.
type Scanner struct {
	logger klog.Logger
	r      *rootfs.Root
	root   string
	// seen are the record files of the directories visited.
	seen map[string]bool
}

// NewScanner returns a scanner of r, which was opened on root: the paths
// it returns are built on root as given. It logs to logger.
func NewScanner(logger klog.Logger, r *rootfs.Root, root string) *Scanner {
	return &Scanner{logger: logger, r: r, root: root, seen: map[string]bool{}}
}

// PodVolume is a pod volume directory found:
// pods/{PodUID}/volumes/kubernetes.io~csi/{Name}.
type PodVolume struct {
	PodUID types.UID
	// Name is the directory's name: the PV's name, or the pod's volume
	// name for an inline volume.
	Name string
	// Rel is the directory relative to the root, Dir on the root as given.
	Rel, Dir string
	// Data is its vol_data.json; nil when it cannot be read, and DataErr
	// says why.
	Data    *VolumeData
	DataErr error
	// Record is nodevol's record of the directory; nil when there is none
	// or it cannot be used (logged).
	Record *Record
}

// Pods lists the pod directories.
func (s *Scanner) Pods() []string { return s.dirs(podsDir) }

// PodVolumes yields the CSI volume directories of pods, in order.
func (s *Scanner) PodVolumes(pods []string) iter.Seq[PodVolume] {
	return func(yield func(PodVolume) bool) {
		for _, uid := range pods {
			for _, name := range s.dirs(path.Join(podsDir, uid, podVolumesDir)) {
				rel := path.Join(podsDir, uid, podVolumesDir, name)
				s.RemoveWriteLeftovers(rel)
				v := PodVolume{PodUID: types.UID(uid), Name: name, Rel: rel, Dir: filepath.Join(s.root, rel), Record: s.Record(rel)}
				v.Data, v.DataErr = readVolumeData(s.r, rel)
				if !yield(v) {
					return
				}
			}
		}
	}
}

// BlockVolume is what a raw block volume's directory tells of it.
type BlockVolume struct {
	// Paths are the volume's paths (for the pod, when one was given).
	Paths BlockPaths
	// Data is the volume's vol_data.json; nil when Err is set (the spec
	// name is not a safe path element, or vol_data.json cannot be read).
	Data *VolumeData
	Err  error
}

// ReadBlockVolume reads raw block volume specName's vol_data.json and
// returns its paths for pod uid (none for "").
func (s *Scanner) ReadBlockVolume(specName string, uid types.UID) BlockVolume {
	var v BlockVolume
	v.Paths, v.Err = BlockVolumePaths(s.root, specName, uid)
	if v.Err == nil {
		v.Data, v.Err = readVolumeData(s.r, path.Join(blockDevicesDir, specName, "data"))
	}
	return v
}

// BlockLink is a pod's symlink to a raw block volume:
// pods/{PodUID}/volumeDevices/kubernetes.io~csi/{SpecName}.
type BlockLink struct {
	PodUID   types.UID
	SpecName string
	// Path is the symlink, on the root as given.
	Path string
	// Volume is what the volume's data directory tells.
	Volume BlockVolume
}

// BlockLinks yields the raw block volumes' symlinks of pods, in order.
func (s *Scanner) BlockLinks(pods []string) iter.Seq[BlockLink] {
	return func(yield func(BlockLink) bool) {
		for _, uid := range pods {
			for _, name := range s.entries(path.Join(podsDir, uid, podBlockLinksDir)) {
				l := BlockLink{PodUID: types.UID(uid), SpecName: name, Path: filepath.Join(s.root, podsDir, uid, podBlockLinksDir, name)}
				l.Volume = s.ReadBlockVolume(name, l.PodUID)
				if !yield(l) {
					return
				}
			}
		}
	}
}

// BlockPublish is a raw block volume's publish path for a pod:
// volumeDevices/publish/{SpecName}/{PodUID}, with its Record (nil when
// none).
type BlockPublish struct {
	SpecName, PodUID string
	Record           *Record
}

// BlockPublishes yields the publish paths of raw block volumes; a symlink
// in their place is logged and skipped.
func (s *Scanner) BlockPublishes() iter.Seq[BlockPublish] {
	return func(yield func(BlockPublish) bool) {
		for _, specName := range s.dirs(blockPublishDir) {
			dir := path.Join(blockPublishDir, specName)
			list, err := s.r.ReadDir(dir)
			if err != nil {
				s.refused(err, dir)
				continue
			}
			for _, e := range list {
				rel := path.Join(dir, e.Name())
				if e.Type()&fs.ModeSymlink != 0 {
					s.logger.Info("Ignoring a symlink where a publish path is expected: symlinks under the root are not followed", "path", filepath.Join(s.root, rel))
					continue
				}
				if !yield(BlockPublish{SpecName: specName, PodUID: e.Name(), Record: s.Record(rel)}) {
					return
				}
			}
		}
	}
}

// BlockPublishRecords are the records of raw block publish paths that the
// scan has not read: those whose publish path is gone, or was not
// created. Only records ReadRecord would accept, of publish paths named as
// BlockVolumePaths names them.
func (s *Scanner) BlockPublishRecords() []*Record {
	var out []*Record
	for f := range s.UnseenRecords() {
		rec := f.Record
		if rec == nil {
			continue // the caller logs it
		}
		specName := path.Base(path.Dir(rec.Dir))
		if rec.Mode != string(podvol.Block) || rec.PodUID == "" || path.Base(rec.Dir) != rec.PodUID ||
			path.Dir(path.Dir(rec.Dir)) != blockPublishDir || fsutil.ValidateName("spec name", specName) != nil ||
			rec.Version < 1 || rec.Version > recordVersion || rec.Driver == "" || rec.VolumeHandle == "" || rec.Phase.Call() == "" {
			continue
		}
		out = append(out, rec)
	}
	return out
}

// BlockDir is a raw block volume's directory volumeDevices/{SpecName}.
type BlockDir struct {
	// SpecName is its name, Dir the directory on the root as given.
	SpecName, Dir string
	// DataFile is its vol_data.json, on the root as given; HasData tells
	// whether it is there (a symlink included). Volume is what it tells,
	// when it is.
	DataFile string
	HasData  bool
	Volume   BlockVolume
}

// BlockDirs yields the raw block volumes' directories.
func (s *Scanner) BlockDirs() iter.Seq[BlockDir] {
	return func(yield func(BlockDir) bool) {
		for _, specName := range s.dirs(blockDevicesDir) {
			if specName == blockStagingEntry || specName == blockPublishEntry {
				continue // the directories of the staging and publish paths
			}
			dataDir := path.Join(blockDevicesDir, specName, "data")
			s.RemoveWriteLeftovers(dataDir)
			file := path.Join(dataDir, VolumeDataFile)
			d := BlockDir{SpecName: specName, Dir: filepath.Join(s.root, blockDevicesDir, specName), DataFile: filepath.Join(s.root, file), HasData: s.exists(file)}
			if d.HasData {
				d.Volume = s.ReadBlockVolume(specName, "")
			}
			if !yield(d) {
				return
			}
		}
	}
}

// StagingDirEntry is a directory in a driver's directory of the CSI
// plugin's: {pluginDir}/{Driver}/{Name}, a staging directory when it holds
// a vol_data.json (an older kubelet's pv/{pvName} is one too).
type StagingDirEntry struct {
	Driver, Name string
	// Rel is the directory relative to the root, Dir on the root as given.
	Rel, Dir string
	// HasData tells whether vol_data.json is there; Data is what it
	// holds, nil when DataErr says it cannot be read.
	HasData bool
	Data    *VolumeData
	DataErr error
}

// StagingDirs yields the directories in the drivers' directories. The
// write leftovers are removed only from one with a vol_data.json.
func (s *Scanner) StagingDirs() iter.Seq[StagingDirEntry] {
	return func(yield func(StagingDirEntry) bool) {
		for _, driver := range s.dirs(pluginDir) {
			for _, name := range s.dirs(path.Join(pluginDir, driver)) {
				rel := path.Join(pluginDir, driver, name)
				e := StagingDirEntry{Driver: driver, Name: name, Rel: rel, Dir: filepath.Join(s.root, rel)}
				if e.HasData = s.exists(path.Join(rel, VolumeDataFile)); e.HasData {
					s.RemoveWriteLeftovers(rel)
					e.Data, e.DataErr = readVolumeData(s.r, rel)
				}
				if !yield(e) {
					return
				}
			}
		}
	}
}

// Staged is a volume's staging directory as found.
type Staged struct {
	// Rel is the directory relative to the root; StagingPath the staging
	// path on the root as given.
	Rel, StagingPath string
	// Record is the directory's record (nil when none or unusable), Data
	// its vol_data.json (nil when it cannot be read).
	Record *Record
	Data   *VolumeData
}

// Staged finds the staging directory of a volume (driver, handle, PV
// name; volume names it in logs): the hashed one (StagingDir), or an
// older kubelet's (FindLegacyStaging). ok is false when it does not exist
// or is a symlink (logged).
func (s *Scanner) Staged(volume, driver, handle, pvName string) (st Staged, ok bool) {
	st.StagingPath, _ = StagingPath(s.root, driver, handle)
	dir, err := StagingDir(s.r.Path(), driver, handle)
	if err != nil {
		return Staged{}, false
	}
	switch legacy, found, err := FindLegacyStaging(s.r, s.root, pvName, driver, handle); {
	case err != nil:
		s.logger.Info("Ignoring the legacy staging directory of a volume", "volume", volume, "err", err.Error())
	case found:
		st.StagingPath = filepath.Join(legacy, StagingLeaf)
		dir, _ = LegacyStagingDir(s.r.Path(), pvName)
	}
	fi, err := s.r.Lstat(dir)
	switch {
	case err != nil:
		s.refused(err, dir)
		return Staged{}, false
	case fi.Mode()&fs.ModeSymlink != 0:
		s.logger.Info("Ignoring a symlink where a staging directory is expected: symlinks under the root are not followed", "path", dir)
		return Staged{}, false
	}
	if st.Rel, err = s.r.Rel(dir); err != nil {
		return Staged{}, false
	}
	st.Record = s.Record(st.Rel)
	st.Data, _ = readVolumeData(s.r, st.Rel)
	return st, true
}

// Record reads the record of directory rel; nil when there is none or it
// cannot be used (logged: the volume is then recovered from vol_data.json
// and the mount table alone). Anything but a regular file where the record
// goes is taken back (takeBackRecord), so that it does not stand in the
// way of the next write; a directory that is not empty stays, and is only
// logged.
func (s *Scanner) Record(rel string) *Record {
	s.MarkSeen(rel)
	rec, err := ReadRecord(s.r, rel)
	switch {
	case err == nil:
		return rec
	case errors.Is(err, fs.ErrNotExist):
	default:
		if taken, _ := takeBackRecord(s.r, rel); taken {
			s.logger.Info("Removed what stood where nodevol's record of a volume directory goes, not a regular file; recovering it as Uncertain from vol_data.json",
				"path", filepath.Join(s.root, RecordFile(rel)), "dir", filepath.Join(s.root, rel), "err", err.Error())
			return nil
		}
		s.logger.Error(err, "Ignoring nodevol's record of a volume directory; recovering it as Uncertain from vol_data.json", "path", filepath.Join(s.root, rel))
	}
	return nil
}

// MarkSeen counts the record of directory rel (relative to the root) as
// read: UnseenRecords leaves it out.
func (s *Scanner) MarkSeen(rel string) { s.seen[path.Base(RecordFile(rel))] = true }

// RecordEntry is a record file found in the records directory. Record is
// nil when it cannot be read or does not name its directory (its file is
// not RecordFile(Record.Dir)); Err then says why, when it can.
type RecordEntry struct {
	// Name is the record's file, relative to the root.
	Name   string
	Record *Record
	Err    error
}

// UnseenRecords yields the records the scan has not read (Record,
// MarkSeen) when it gets to them; anything but a regular file is left out.
func (s *Scanner) UnseenRecords() iter.Seq[RecordEntry] {
	return func(yield func(RecordEntry) bool) {
		for _, shard := range s.dirs(RecordsDir) {
			dir := path.Join(RecordsDir, shard)
			list, err := s.r.ReadDir(dir)
			if err != nil {
				s.refused(err, dir)
				continue
			}
			for _, e := range list {
				if s.seen[e.Name()] || !e.Type().IsRegular() {
					continue
				}
				f := RecordEntry{Name: path.Join(dir, e.Name())}
				var rec Record
				if f.Err = fsutil.ReadJSONIn(s.r, f.Name, &rec); f.Err == nil && rec.Dir != "" && RecordFile(rec.Dir) == f.Name {
					f.Record = &rec
				}
				if !yield(f) {
					return
				}
			}
		}
	}
}

// RemoveWriteLeftovers removes the temporary files of vol_data.json writes
// a crash cut short in volume directory rel (the package function): they
// would make the kubelet's teardown fail after a hand-over (it rmdirs the
// directory), and nodevol's. Logged when it cannot.
func (s *Scanner) RemoveWriteLeftovers(rel string) {
	if err := RemoveWriteLeftovers(s.r, rel); err != nil {
		s.logger.Error(err, "Cannot remove the leftovers of an interrupted vol_data.json write", "path", filepath.Join(s.root, rel))
	}
}

// entries lists the names in directory dir (relative to the root); a
// missing dir has none. A dir that is, or is below, a symlink is logged and
// has none.
func (s *Scanner) entries(dir string) []string {
	list, err := s.r.ReadDir(dir)
	if err != nil {
		s.refused(err, dir)
		return nil
	}
	names := make([]string, 0, len(list))
	for _, e := range list {
		names = append(names, e.Name())
	}
	return names
}

// dirs lists the directories in dir, as entries does; a symlink in dir is
// logged and skipped, as is anything else that is not a directory.
func (s *Scanner) dirs(dir string) []string {
	list, err := s.r.ReadDir(dir)
	if err != nil {
		s.refused(err, dir)
		return nil
	}
	var names []string
	for _, e := range list {
		switch {
		case e.Type()&fs.ModeSymlink != 0:
			s.logger.Info("Ignoring a symlink where a directory is expected: symlinks under the root are not followed", "path", filepath.Join(s.r.Path(), dir, e.Name()))
		case e.IsDir():
			names = append(names, e.Name())
		}
	}
	return names
}

// exists tells whether name is there (a symlink included) and reached
// without following a symlink.
func (s *Scanner) exists(name string) bool {
	_, err := s.r.Lstat(name)
	if err != nil {
		s.refused(err, name)
	}
	return err == nil
}

// refused logs why a path could not be read, unless it is simply missing.
func (s *Scanner) refused(err error, name string) {
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case errors.Is(err, rootfs.ErrSymlink):
		s.logger.Info("Ignoring a path through a symlink: symlinks under the root are not followed", "err", err.Error())
	default:
		s.logger.Error(err, "Cannot read a directory under the root, skipping it", "path", name)
	}
}
