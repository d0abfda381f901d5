package ondisk

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

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
	r, err := rootfs.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := r.MkdirAll(".", 0o750); err != nil {
		t.Fatal(err)
	}
	rs := NewRecords(r, "boot")
	h, err := r.Hold()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
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
