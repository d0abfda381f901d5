package ondisk

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/internal/fsutil"
	"github.com/nodevol/nodevol/internal/rootfs"
	"github.com/nodevol/nodevol/podvol"
)

// The durable record of work in flight.
//
// Before each NodeStageVolume, NodePublishVolume, NodeUnpublishVolume and
// NodeUnstageVolume the plugin writes (see Records.Write for how) a record of
// the call about to be made, and after a stage or publish succeeds it
// records it as done; after an unpublish or unstage has removed the
// volume's directory it removes the record. Each record also holds the
// boot ID of the node when it was written. After a crash, the record says
// which call was in flight (so the volume is Uncertain and the call is
// repeated or undone) or that the call completed on this boot (so a volume
// whose mount point is still mounted is Mounted, with no call at all);
// after a reboot (another boot ID) it says that nothing is mounted any
// more.
//
// The records live in nodevol's own directory, {root}/nodevol/records,
// one file per staging or pod volume directory, not beside vol_data.json:
// the kubelet removes a volume directory with rmdir after deleting the
// files it knows, so an extra file there would make every teardown of the
// kubelet fail after a node moved from nodevol to the kubelet. The
// kubelet ignores {root}/nodevol, and vol_data.json stays as the kubelet
// writes it.

// RecordsDir is the directory of the records, relative to the root.
const RecordsDir = "nodevol/records"

// recordVersion is the version of the records this package writes; a
// record of a newer version is not read (errRecordVersion).
const recordVersion = 1

// DefaultBootIDPath is where Linux tells the boot ID.
const DefaultBootIDPath = "/proc/sys/kernel/random/boot_id"

// errRecordVersion is wrapped by ReadRecord's error for a record written by
// a newer nodevol.
var errRecordVersion = errors.New("record written by a newer version")

// Phase is the call a record is about and whether it completed.
type Phase string

// The phases. A volume directory with a record in an in-flight phase may
// have been half staged, published, unpublished or unstaged.
const (
	PhaseStaging      Phase = "Staging"      // NodeStageVolume sent, not known to have completed
	PhaseStaged       Phase = "Staged"       // NodeStageVolume completed
	PhaseUnstaging    Phase = "Unstaging"    // NodeUnstageVolume sent, directory not yet removed
	PhasePublishing   Phase = "Publishing"   // NodePublishVolume sent, not known to have completed
	PhasePublished    Phase = "Published"    // NodePublishVolume completed
	PhaseUnpublishing Phase = "Unpublishing" // NodeUnpublishVolume sent, directory not yet removed
)

// Done reports whether the phase is a completed stage or publish.
func (p Phase) Done() bool { return p == PhaseStaged || p == PhasePublished }

// Call is the CSI call of the phase ("NodeStageVolume", ...), "" for an
// unknown phase.
func (p Phase) Call() string {
	switch p {
	case PhaseStaging, PhaseStaged:
		return "NodeStageVolume"
	case PhaseUnstaging:
		return "NodeUnstageVolume"
	case PhasePublishing, PhasePublished:
		return "NodePublishVolume"
	case PhaseUnpublishing:
		return "NodeUnpublishVolume"
	}
	return ""
}

// RecordSecretRef names a Secret; a record never holds secret values.
type RecordSecretRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// Record is what recovery needs to know of one staging or pod volume
// directory.
type Record struct {
	Version int    `json:"version"`
	BootID  string `json:"bootID"`
	Phase   Phase  `json:"phase"`
	// Dir is the staging or pod volume directory, relative to the root;
	// for a raw block volume, its staging path or its publish path for
	// the pod (csi_block.go's layout).
	Dir          string `json:"dir"`
	Driver       string `json:"driver"`
	VolumeHandle string `json:"volumeHandle"`
	PVName       string `json:"pvName,omitempty"`
	// PodUID, PodNamespace and PodName are set in a pod volume's record.
	PodUID       string `json:"podUID,omitempty"`
	PodNamespace string `json:"podNamespace,omitempty"`
	PodName      string `json:"podName,omitempty"`
	// SpecName is the pod volume directory's name.
	SpecName  string `json:"specName,omitempty"`
	Ephemeral bool   `json:"ephemeral,omitempty"`
	// Mode is "Filesystem" or "Block".
	Mode             string            `json:"mode"`
	AccessMode       string            `json:"accessMode,omitempty"`
	FSType           string            `json:"fsType,omitempty"`
	MountOptions     []string          `json:"mountOptions,omitempty"`
	ReadOnly         bool              `json:"readOnly,omitempty"`
	PublishContext   map[string]string `json:"publishContext,omitempty"`
	StageSecretRef   *RecordSecretRef  `json:"nodeStageSecretRef,omitempty"`
	PublishSecretRef *RecordSecretRef  `json:"nodePublishSecretRef,omitempty"`
	// Time is when the record was written.
	Time time.Time `json:"time"`
}

// RecordFile is the name of dir's record, relative to the root: a hash of
// dir (relative to the root), so that any directory name maps to one file
// name, in one of 256 directories named after the hash's first byte. One
// directory for all records made every concurrent create and remove wait
// for that directory's lock: on ext4, mounting 1,000 pods spent a fifth of
// its time there.
func RecordFile(dir string) string {
	// Built in one allocation, on the stack until the result: it is
	// named at every record written and removed (eight times a pod).
	var buf [256]byte
	sum := sha256.Sum256(append(buf[:0], dir...))
	var h [2 * sha256.Size]byte
	hex.Encode(h[:], sum[:])
	return RecordsDir + "/" + string(h[:2]) + "/" + string(h[:]) + ".json"
}

// ReadRecord reads the record of dir (relative to the root) without
// following a symlink. It fails when there is none
// (errors.Is(err, fs.ErrNotExist)), when it is corrupt (fsutil.ErrCorrupt:
// bad JSON, no driver, handle or phase, or about another directory) and
// when a newer version wrote it (errRecordVersion).
func ReadRecord(r *rootfs.Root, dir string) (*Record, error) {
	name := RecordFile(dir)
	var rec Record
	if err := fsutil.ReadJSONIn(r, name, &rec); err != nil {
		return nil, err
	}
	return &rec, checkRecord(name, dir, &rec)
}

// takeBackRecord removes what stands where dir's record goes (dir
// relative to the root) when it is not a regular file: a symlink (the
// link, never what it points to), a FIFO, a socket, a device node or an
// empty directory. ReadRecord and the writes refuse such an entry, and the
// name is nodevol's own. It reports whether it removed one; a regular
// file, or no entry, is left and is no error; a directory that is not
// empty is an error and stays.
func takeBackRecord(r *rootfs.Root, dir string) (bool, error) {
	name := RecordFile(dir)
	fi, err := r.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("taking back the record %s: %w", name, err)
	}
	if fi.Mode().IsRegular() {
		return false, nil
	}
	if err := r.RemoveAny(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("taking back the record %s (%v): %w", name, fi.Mode().Type(), err)
	}
	return true, nil
}

func checkRecord(name, dir string, rec *Record) error {
	switch {
	case rec.Version > recordVersion:
		return fmt.Errorf("reading %s: %w (version %d, this nodevol reads up to %d)", name, errRecordVersion, rec.Version, recordVersion)
	case rec.Version < 1 || rec.Driver == "" || rec.VolumeHandle == "" || rec.Phase.Call() == "":
		return fmt.Errorf("reading %s: %w: version, driver, volumeHandle or phase missing", name, fsutil.ErrCorrupt)
	case rec.Dir != dir:
		return fmt.Errorf("reading %s: %w: record of %q, not of %q", name, fsutil.ErrCorrupt, rec.Dir, dir)
	}
	return nil
}

// ReadBootID reads the node's boot ID from path (DefaultBootIDPath when
// empty).
func ReadBootID(path string) (string, error) {
	if path == "" {
		path = DefaultBootIDPath
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading the boot ID: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if id == "" {
		return "", fmt.Errorf("reading the boot ID: %s is empty", path)
	}
	return id, nil
}

// Records writes and removes the records under one root. It is safe for
// concurrent use, on different directories.
type Records struct {
	rfs *rootfs.Root
	*recordsState
	// open is the record an In view wrote last, held open for the
	// operation's next write of it (nil in a Records from NewRecords).
	open *openRecord
}

// openRecord is one directory's record held open by an operation: the
// write after its call (Staged, Published) is then one system call.
type openRecord struct {
	dir string // relative to the root
	f   *rootfs.RewriteFile
}

// recordsState is what the Records of one root and their In views share.
type recordsState struct {
	bootID string
	made   sync.Map // the directories of RecordsDir known to exist
	pubs   blockPublishes
}

// NewRecords returns the writer of the records under r, stamped with
// bootID (see ReadBootID; "" when unknown).
func NewRecords(r *rootfs.Root, bootID string) *Records {
	return &Records{rfs: r, recordsState: &recordsState{bootID: bootID}}
}

// In returns rs writing through r, a Root on the same directory (one
// from Hold, for one operation's records), and sharing everything else
// with rs. It is valid as long as r is. It holds the record it wrote
// last open until the next record is written or removed, or Close: one
// operation's view, not for concurrent use.
func (rs *Records) In(r *rootfs.Root) *Records {
	return &Records{rfs: r, recordsState: rs.recordsState, open: &openRecord{}}
}

// Close closes the record an In view holds open, if any.
func (rs *Records) Close() {
	if rs.open != nil && rs.open.f != nil {
		_ = rs.open.f.Close()
		rs.open.f, rs.open.dir = nil, ""
	}
}

// BootID is the boot ID the records are written with.
func (rs *Records) BootID() string { return rs.bootID }

// Write writes rec for rec.Dir (absolute or relative to the root) over
// the directory's record.
//
// In place and without fsync. The page cache survives the crash of the
// process, so a record written before a call is there after a SIGKILL.
// fsync would add survival of a power loss or a kernel crash, and both
// are a reboot: after one nothing is mounted, which a record of the
// earlier boot, a torn record (refused as corrupt) or no record all lead
// recovery to, so no decision depends on the lost write. A crash between
// the write and the cut to length leaves a mix that the JSON decoder
// refuses: the volume is then Uncertain, as without a record. Measured
// with BenchmarkMountPods at 1,000 pods on this machine's ext4 disk (busy),
// fsync'ing every record (file and directory) took mounting from 1.55 s
// to 5.1 s; a temporary file renamed over the record was slower too (ext4
// writes a file back when it replaces another by rename).
//
// Anything but a regular file where the record goes (a symlink, a FIFO,
// an empty directory: planted, or a tampered disk) is taken back
// (takeBackRecord) and the record written again: the name is nodevol's,
// and refusing it would fail every call on the volume until a person
// removed it.
func (rs *Records) Write(ctx context.Context, rec *Record) error {
	dir, err := rs.rfs.Rel(rec.Dir)
	if err != nil {
		return err
	}
	rec.Dir, rec.Version, rec.BootID, rec.Time = dir, recordVersion, rs.bootID, time.Now().UTC()
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if rs.open != nil && rs.open.f != nil && rs.open.dir == dir {
		// The operation's second write of the record: on the descriptor
		// its first write opened.
		if err := rs.open.f.Rewrite(data); err != nil {
			return fmt.Errorf("recording %s of %s: %w", rec.Phase.Call(), dir, err)
		}
		rs.wrote(rec, dir)
		return nil
	}
	rs.Close()
	name := RecordFile(dir)
	shard := path.Dir(name)
	if _, ok := rs.made.Load(shard); !ok {
		if err := rs.rfs.MkdirAll(shard, 0o750); err != nil {
			return fmt.Errorf("recording %s of %s: %w", rec.Phase.Call(), dir, err)
		}
		rs.made.Store(shard, true)
	}
	if rs.open != nil {
		// Held open for the write after the call. A stage or publish
		// about to be made expects no record (created with O_EXCL, no
		// fstat); padding a shorter record with spaces spares the cut.
		fresh := rec.Phase == PhaseStaging || rec.Phase == PhasePublishing
		f, err := rs.rfs.OpenRewrite(name, data, 0o600, fresh, ' ')
		if err == nil {
			rs.open.dir, rs.open.f = dir, f
			rs.wrote(rec, dir)
			return nil
		}
		// Anything else there (a symlink, a FIFO, a directory), the shard
		// gone, or the hook's refusal: the write below, which takes back
		// what is not a regular file and asks the hook again.
	}
	err = rs.rfs.WriteFileInPlace(name, data, 0o600)
	if err != nil {
		// Only after a failure: a write that succeeds costs nothing more.
		switch taken, terr := takeBackRecord(rs.rfs, dir); {
		case terr != nil:
			err = fmt.Errorf("%w; %w", err, terr)
		case taken:
			klog.FromContext(ctx).Info("Removed what stood where the record of a volume goes: it was not a regular file; writing the record again", "path", path.Join(rs.rfs.Path(), name))
			err = rs.rfs.WriteFileInPlace(name, data, 0o600)
		}
	}
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			rs.made.Delete(shard) // removed behind our back: made again next time
		}
		return fmt.Errorf("recording %s of %s: %w", rec.Phase.Call(), dir, err)
	}
	rs.wrote(rec, dir)
	return nil
}

// wrote notes the record of dir just written in the index of block
// publishes.
func (rs *Records) wrote(rec *Record, dir string) {
	if rec.Mode == string(podvol.Block) && rec.PodUID != "" {
		rs.pubs.add(dir)
	}
}

// Remove removes dir's record; a missing one is no error. Whatever stands
// at the record's name goes (a symlink itself, not what it points to), as
// in Write.
func (rs *Records) Remove(dir string) error {
	dir, err := rs.rfs.Rel(dir)
	if err != nil {
		return err
	}
	rs.Close()
	if err := rs.rfs.Unlink(RecordFile(dir)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing the record of %s: %w", dir, err)
	}
	rs.pubs.drop(dir)
	return nil
}

// blockPublishes are the records of raw block publish paths, by publish
// directory (volumeDevices/publish/{specName}), relative to the root: so
// that an unstage can tell whether a publish of its volume may remain
// without reading every record each time. They are read from disk at the
// first use and kept current by Write and Remove from then on; a record
// removed behind nodevol's back only keeps an unstage waiting, never lets
// one through.
type blockPublishes struct {
	mu     sync.Mutex
	loaded bool
	byDir  map[string]map[string]bool
}

func (b *blockPublishes) add(publishPath string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.addLocked(publishPath)
}

func (b *blockPublishes) addLocked(publishPath string) {
	dir := path.Dir(publishPath)
	if b.byDir == nil {
		b.byDir = map[string]map[string]bool{}
	}
	if b.byDir[dir] == nil {
		b.byDir[dir] = map[string]bool{}
	}
	b.byDir[dir][publishPath] = true
}

func (b *blockPublishes) drop(publishPath string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	dir := path.Dir(publishPath)
	delete(b.byDir[dir], publishPath)
	if len(b.byDir[dir]) == 0 {
		delete(b.byDir, dir)
	}
}

// PublishedIn returns the publish paths (relative to the root) in
// publishDir that have a record: a publish or unpublish of each may have
// been made.
func (rs *Records) PublishedIn(publishDir string) ([]string, error) {
	dir, err := rs.rfs.Rel(publishDir)
	if err != nil {
		return nil, err
	}
	b := &rs.pubs
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.loaded {
		if err := rs.loadPublishes(); err != nil {
			return nil, fmt.Errorf("reading the records of block publishes: %w", err)
		}
		b.loaded = true
	}
	out := make([]string, 0, len(b.byDir[dir]))
	for p := range b.byDir[dir] {
		out = append(out, p)
	}
	sort.Strings(out)
	return out, nil
}

// loadPublishes reads every record once and indexes those of block
// publish paths. The caller holds rs.pubs.mu. A record that cannot be read
// names no publish; reconstruction logs it.
func (rs *Records) loadPublishes() error {
	shards, err := rs.rfs.ReadDir(RecordsDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	for _, shard := range shards {
		if !shard.IsDir() {
			continue
		}
		files, err := rs.rfs.ReadDir(path.Join(RecordsDir, shard.Name()))
		if err != nil {
			return err
		}
		for _, f := range files {
			name := path.Join(RecordsDir, shard.Name(), f.Name())
			var rec Record
			if !f.Type().IsRegular() || fsutil.ReadJSONIn(rs.rfs, name, &rec) != nil {
				continue
			}
			if rec.Mode == string(podvol.Block) && rec.PodUID != "" && RecordFile(rec.Dir) == name {
				rs.pubs.addLocked(rec.Dir)
			}
		}
	}
	return nil
}

// Update writes rec in phase ph, logging a failure instead of returning it:
// used where the call it records has already been made, or where a
// teardown must not wait for the record. Without it recovery falls back to
// vol_data.json and an Uncertain volume, as the kubelet does.
func (rs *Records) Update(ctx context.Context, rec *Record, ph Phase) {
	rec.Phase = ph
	if err := rs.Write(ctx, rec); err != nil {
		klog.FromContext(ctx).Error(err, "Cannot write the record of the volume; a restart will treat it as Uncertain", "phase", ph)
	}
}
