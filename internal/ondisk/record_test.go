package ondisk

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodevol/nodevol/internal/fsutil"
	"github.com/nodevol/nodevol/internal/rootfs"
)

// TestReadRecordRefuses: records that cannot be trusted give errors that
// say why.
func TestReadRecordRefuses(t *testing.T) {
	root := t.TempDir()
	r, err := rootfs.New(root)
	if err != nil {
		t.Fatal(err)
	}
	const dir = "pods/uid/volumes/kubernetes.io~csi/pv"
	if err := r.MkdirAll(path.Dir(RecordFile(dir)), 0o750); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, content string
		want          error
	}{
		{"missing", "", fs.ErrNotExist},
		{"empty", " ", fsutil.ErrCorrupt},
		{"truncated", `{"version":1,"phase":"Publ`, fsutil.ErrCorrupt},
		{"no handle", `{"version":1,"phase":"Published","dir":"` + dir + `","driver":"d"}`, fsutil.ErrCorrupt},
		{"unknown phase", `{"version":1,"phase":"Dancing","dir":"` + dir + `","driver":"d","volumeHandle":"h"}`, fsutil.ErrCorrupt},
		{"another dir", `{"version":1,"phase":"Published","dir":"pods/x","driver":"d","volumeHandle":"h"}`, fsutil.ErrCorrupt},
		{"newer", `{"version":2,"phase":"Published","dir":"` + dir + `","driver":"d","volumeHandle":"h"}`, errRecordVersion},
	} {
		name := filepath.Join(root, RecordFile(dir))
		_ = os.Remove(name)
		if tc.content != "" {
			if err := os.WriteFile(name, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := ReadRecord(r, dir); !errors.Is(err, tc.want) {
			t.Errorf("%s: ReadRecord = %v, want %v", tc.name, err, tc.want)
		}
	}
}

// TestRemoveUnusedVolumeDir removes only what cannot hold data, and
// follows no symlink.
func TestRemoveUnusedVolumeDir(t *testing.T) {
	const dir = "pods/uid/volumes/kubernetes.io~csi/pv"
	remove := func(name string) func(*testing.T, string) {
		return func(t *testing.T, abs string) {
			if err := os.Remove(filepath.Join(abs, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		name      string
		plant     func(t *testing.T, abs string)
		mounted   string // the mount point, relative to dir ("." for dir)
		wantError bool
	}{
		{"clean", func(*testing.T, string) {}, "", false},
		{"no vol_data.json", remove(VolumeDataFile), "", false},
		{"no vol_data.json, no mount", func(t *testing.T, abs string) { remove(VolumeDataFile)(t, abs); remove("mount")(t, abs) }, "", false},
		{"temp file of a write", func(t *testing.T, abs string) { write(t, filepath.Join(abs, ".vol_data.json.tmp-0a1b"), "{") }, "", false},
		{"mount point", func(*testing.T, string) {}, "mount", true},
		{"dir a mount point", func(*testing.T, string) {}, ".", true},
		{"vol_data.json a mount point", func(*testing.T, string) {}, VolumeDataFile, true},
		{"data in mount", func(t *testing.T, abs string) { write(t, filepath.Join(abs, "mount", "data"), "x") }, "", true},
		{"stranger beside", func(t *testing.T, abs string) { write(t, filepath.Join(abs, "other"), "x") }, "", true},
		{"mount a symlink", func(t *testing.T, abs string) {
			remove("mount")(t, abs)
			if err := os.Symlink(t.TempDir(), filepath.Join(abs, "mount")); err != nil {
				t.Fatal(err)
			}
		}, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			abs := filepath.Join(root, dir)
			write(t, filepath.Join(abs, VolumeDataFile), `{}`)
			write(t, filepath.Join(root, RecordFile(dir)), `{}`)
			if err := os.MkdirAll(filepath.Join(abs, "mount"), 0o750); err != nil {
				t.Fatal(err)
			}
			tc.plant(t, abs)
			r, _ := rootfs.New(root)
			isMountPoint := func(p string) bool { return tc.mounted != "" && p == filepath.Join(abs, tc.mounted) }
			err := RemoveUnusedVolumeDir(r, isMountPoint, dir, "mount")
			if (err != nil) != tc.wantError {
				t.Fatalf("RemoveUnusedVolumeDir = %v, want error %v", err, tc.wantError)
			}
			if _, statErr := os.Lstat(abs); tc.wantError == errors.Is(statErr, fs.ErrNotExist) {
				t.Errorf("directory after: %v", statErr)
			}
			if _, statErr := os.Lstat(filepath.Join(root, RecordFile(dir))); tc.wantError == errors.Is(statErr, fs.ErrNotExist) {
				t.Errorf("record after: %v", statErr)
			}
			if tc.wantError {
				// Nothing removed: what is left can still be reconstructed.
				for _, name := range []string{VolumeDataFile, "mount"} {
					if _, err := os.Lstat(filepath.Join(abs, name)); err != nil {
						t.Errorf("%s removed: %v", name, err)
					}
				}
			}
		})
	}
}

func write(t *testing.T, name, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestRecordFile pins the records' names (a restart finds the records an
// earlier version wrote by them) and that naming one allocates only the
// name: it is done at every record written and removed.
func TestRecordFile(t *testing.T) {
	for _, dir := range []string{
		"plugins/kubernetes.io/csi/drv/abc/globalmount",
		"pods/uid/volumes/kubernetes.io~csi/pv-1",
		strings.Repeat("x", 300), // past the stack buffer
		"",
	} {
		sum := sha256.Sum256([]byte(dir))
		h := hex.EncodeToString(sum[:])
		want := path.Join(RecordsDir, h[:2], h+".json")
		if got := RecordFile(dir); got != want {
			t.Errorf("RecordFile(%q) = %q, want %q", dir, got, want)
		}
	}
	if got := RecordFile("a"); got != "nodevol/records/ca/ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb.json" {
		t.Errorf("RecordFile(%q) = %q: the name of the records changed", "a", got)
	}
	dir := "pods/0f7c2c7e-5b7e-4b59-9d3e-6f0e0c9b2a11/volumes/kubernetes.io~csi/pvc-0f7c2c7e-5b7e-4b59-9d3e-6f0e0c9b2a11"
	if n := testing.AllocsPerRun(100, func() { _ = RecordFile(dir) }); n > 1 {
		t.Errorf("RecordFile allocates %v times, want 1 (the name)", n)
	}
}

// TestRecordsIn: records written and removed through a held root are
// those of the root, and a view shares the block publishes it learns of.
func TestRecordsIn(t *testing.T) {
	r, rs, h := heldRecords(t)
	in := rs.In(h)
	const dir = "plugins/kubernetes.io/csi/volumeDevices/publish/pv/uid"
	rec := &Record{Dir: dir, Driver: "d", VolumeHandle: "h", Phase: PhasePublishing, Mode: "Block", PodUID: "uid"}
	if err := in.Write(t.Context(), rec); err != nil {
		t.Fatal(err)
	}
	got, err := ReadRecord(r, dir)
	if err != nil || got.Phase != PhasePublishing || got.BootID != "boot" {
		t.Fatalf("ReadRecord = %+v, %v; want the record written through the view", got, err)
	}
	if pubs, err := rs.PublishedIn(path.Dir(dir)); err != nil || len(pubs) != 1 || pubs[0] != dir {
		t.Errorf("PublishedIn = %q, %v; want the publish written through the view", pubs, err)
	}
	if err := in.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadRecord(r, dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after Remove through the view: %v, want no record", err)
	}
	if pubs, _ := rs.PublishedIn(path.Dir(dir)); len(pubs) != 0 {
		t.Errorf("PublishedIn after Remove = %q, want none", pubs)
	}
}

// TestRecordsInRewrite: an operation's view writes a record before its
// call and again after it on one descriptor: the second, shorter, record
// reads back as itself (padded, not cut); one written over a record an
// older nodevol wrote (no padding, cut to length) reads back too; and a
// record left torn by a stop in the middle of the write after the call
// reads as the call in flight, or as corrupt (which recovery treats as in
// flight too), never as another call's or another directory's.
func TestRecordsInRewrite(t *testing.T) {
	r, rs, h := heldRecords(t)
	const dir = "plugins/kubernetes.io/csi/d/0123"
	in := rs.In(h)
	rec := &Record{Dir: dir, Driver: "d", VolumeHandle: "h", PVName: "pv-of-a-long-name", Phase: PhaseStaging, Mode: "Filesystem"}
	if err := in.Write(t.Context(), rec); err != nil {
		t.Fatal(err)
	}
	staging, err := os.ReadFile(filepath.Join(r.Path(), RecordFile(dir)))
	if err != nil {
		t.Fatal(err)
	}
	rec.PVName = "" // shorter by far more than the time can grow
	in.Update(t.Context(), rec, PhaseStaged)
	in.Close()
	if got, err := ReadRecord(r, dir); err != nil || got.Phase != PhaseStaged {
		t.Fatalf("after the rewrite ReadRecord = %+v, %v; want Staged", got, err)
	}
	staged, _ := os.ReadFile(filepath.Join(r.Path(), RecordFile(dir)))
	if len(staged) != len(staging) || staged[len(staged)-1] != ' ' {
		t.Errorf("the shorter record is %d bytes ending in %q; want padded to %d", len(staged), staged[len(staged)-1:], len(staging))
	}

	// Torn: each prefix of the Staged record over the Staging one.
	stagedJSON, _ := json.Marshal(&Record{Version: 1, BootID: "boot", Phase: PhaseStaged, Dir: dir, Driver: "d", VolumeHandle: "h", Mode: "Filesystem", Time: time.Now().UTC()})
	for k := range len(stagedJSON) {
		torn := append(append([]byte(nil), stagedJSON[:k]...), staging[min(k, len(staging)):]...)
		if err := os.WriteFile(filepath.Join(r.Path(), RecordFile(dir)), torn, 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := ReadRecord(r, dir)
		switch {
		case err != nil && !errors.Is(err, fsutil.ErrCorrupt):
			t.Fatalf("torn at %d: %v, want ErrCorrupt", k, err)
		case err != nil:
		case got.Dir != dir || got.Phase.Call() != "NodeStageVolume":
			t.Fatalf("torn at %d: read as %+v", k, got)
		case got.Phase.Done() && !strings.Contains(string(stagedJSON[:k]), `"phase":"Staged"`):
			t.Fatalf("torn at %d, before the new phase was written: read as done", k)
		}
	}

	// A record an older nodevol wrote (cut to length, not padded), longer
	// than what is written over it, and one shorter.
	for _, old := range []string{
		`{"version":1,"bootID":"old-boot","phase":"Published","dir":"` + dir + `","driver":"d","volumeHandle":"h","pvName":"pv-with-a-long-name","mode":"Filesystem","time":"2026-11-01T00:00:00Z"}`,
		`{"version":1,"bootID":"b","phase":"Staged","dir":"` + dir + `","driver":"d","volumeHandle":"h","mode":"Filesystem","time":"2026-11-01T00:00:00Z"}`,
	} {
		if err := os.WriteFile(filepath.Join(r.Path(), RecordFile(dir)), []byte(old), 0o600); err != nil {
			t.Fatal(err)
		}
		if got, err := ReadRecord(r, dir); err != nil || got.BootID == "boot" {
			t.Fatalf("an older nodevol's record: %+v, %v", got, err)
		}
		in := rs.In(h)
		in.Update(t.Context(), &Record{Dir: dir, Driver: "d", VolumeHandle: "h", Mode: "Filesystem"}, PhaseUnstaging)
		in.Close()
		if got, err := ReadRecord(r, dir); err != nil || got.Phase != PhaseUnstaging || got.PVName != "" {
			t.Errorf("written over an older nodevol's record: %+v, %v", got, err)
		}
	}
}

// TestRecordsInTakesBack: an operation's view takes back what stands
// where the record goes (a symlink: the link, never what it points to),
// as a Records from NewRecords does.
func TestRecordsInTakesBack(t *testing.T) {
	base := t.TempDir()
	r, err := rootfs.New(filepath.Join(base, "root"))
	if err != nil {
		t.Fatal(err)
	}
	const dir = "pods/uid/volumes/kubernetes.io~csi/pv"
	name := filepath.Join(r.Path(), RecordFile(dir))
	if err := os.MkdirAll(filepath.Dir(name), 0o750); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(base, "target")
	if err := os.WriteFile(target, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, name); err != nil {
		t.Fatal(err)
	}
	h, err := r.Hold()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	in := NewRecords(r, "boot").In(h)
	defer in.Close()
	if err := in.Write(t.Context(), &Record{Dir: dir, Driver: "d", VolumeHandle: "h", Phase: PhasePublishing, Mode: "Filesystem", PodUID: "uid"}); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(target); string(got) != "keep" {
		t.Errorf("written through the symlink: the target holds %q", got)
	}
	if got, err := ReadRecord(r, dir); err != nil || got.Phase != PhasePublishing {
		t.Errorf("ReadRecord = %+v, %v", got, err)
	}
}

// heldRecords returns a root in a new directory, its Records of boot
// "boot" and a hold of it, closed when the test ends.
func heldRecords(t *testing.T) (*rootfs.Root, *Records, *rootfs.Root) {
	t.Helper()
	r, err := rootfs.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := r.MkdirAll(".", 0o750); err != nil {
		t.Fatal(err)
	}
	h, err := r.Hold()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return r, NewRecords(r, "boot"), h
}
