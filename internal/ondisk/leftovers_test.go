package ondisk

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nodevol/nodevol/internal/rootfs"
)

// TestRemoveWriteLeftovers removes the temporary files of interrupted
// vol_data.json writes from a volume directory, and nothing else.
func TestRemoveWriteLeftovers(t *testing.T) {
	const dir = "pods/uid/volumes/kubernetes.io~csi/pv"
	for _, tc := range []struct {
		name  string
		plant []string // files (a trailing / makes a directory, "->" a symlink)
		want  []string // what is left, sorted
	}{
		{"clean", []string{VolumeDataFile, "mount/"}, []string{"mount", VolumeDataFile}},
		{"leftover", []string{VolumeDataFile, "mount/", ".vol_data.json.tmp-0a1b2c3d4e5f"}, []string{"mount", VolumeDataFile}},
		{"only leftovers", []string{".vol_data.json.tmp-1", ".vol_data.json.tmp-2"}, nil},
		{"others kept", []string{".vol_data.json.tmp-d/", ".vol_data.json.tmp-l->" + VolumeDataFile, ".other.tmp-1", "vol_data.json.tmp-1"},
			[]string{".other.tmp-1", ".vol_data.json.tmp-d", ".vol_data.json.tmp-l", "vol_data.json.tmp-1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			abs, r := plantRoot(t, dir, tc.plant)
			if err := RemoveWriteLeftovers(r, dir); err != nil {
				t.Fatalf("RemoveWriteLeftovers: %v", err)
			}
			entries, err := os.ReadDir(abs)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range entries {
				got = append(got, e.Name())
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("left: %q, want %q", got, tc.want)
			}
		})
	}
	t.Run("missing directory", func(t *testing.T) {
		r, err := rootfs.New(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		if err := RemoveWriteLeftovers(r, dir); err != nil {
			t.Errorf("RemoveWriteLeftovers of a missing directory: %v", err)
		}
	})
}

// TestRemoveUnusedBlockDir removes a raw block volume directory that a
// stop left holding nothing (no vol_data.json, empty data/ and dev/), and
// leaves every one that may still matter, saying why.
func TestRemoveUnusedBlockDir(t *testing.T) {
	const dir = "plugins/kubernetes.io/csi/volumeDevices/pv"
	for _, tc := range []struct {
		name    string
		plant   []string // under dir: a trailing / makes a directory, "->" a symlink
		removed bool
		errHas  string
	}{
		{"empty", nil, true, ""},
		{"empty data", []string{"data/"}, true, ""},
		{"empty data and dev", []string{"data/", "dev/"}, true, ""},
		{"vol_data.json", []string{"data/", "data/" + VolumeDataFile}, false, "data is not empty"},
		{"map file", []string{"data/", "dev/", "dev/uid"}, false, "dev is not empty"},
		{"a stranger", []string{"data/", "notes"}, false, "holds notes"},
		{"data a symlink", []string{"data->/etc"}, false, "holds data"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			abs, r := plantRoot(t, dir, tc.plant)
			err := RemoveUnusedBlockDir(r, "pv")
			if tc.errHas == "" && err != nil || tc.errHas != "" && (err == nil || !strings.Contains(err.Error(), tc.errHas)) {
				t.Errorf("RemoveUnusedBlockDir = %v, want an error with %q", err, tc.errHas)
			}
			if _, err := os.Lstat(abs); os.IsNotExist(err) != tc.removed {
				t.Errorf("after it, %s: %v; want removed %v", dir, err, tc.removed)
			}
			if _, err := os.Stat("/etc"); err != nil {
				t.Fatalf("/etc: %v", err)
			}
		})
	}
}

// plantRoot makes a root with directory dir (relative to it) holding each
// of plant: a trailing / makes a directory, "name->target" a symlink,
// anything else a file. It returns dir's absolute path and the root.
func plantRoot(t *testing.T, dir string, plant []string) (string, *rootfs.Root) {
	t.Helper()
	r, err := rootfs.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	abs := filepath.Join(r.Path(), dir)
	if err := os.MkdirAll(abs, 0o750); err != nil {
		t.Fatal(err)
	}
	plantEntries(t, abs, plant)
	return abs, r
}

func plantEntries(t *testing.T, dir string, plant []string) {
	t.Helper()
	for _, p := range plant {
		var err error
		switch name, target, link := strings.Cut(p, "->"); {
		case link:
			err = os.Symlink(target, filepath.Join(dir, name))
		case name[len(name)-1] == '/':
			err = os.Mkdir(filepath.Join(dir, name), 0o750)
		default:
			err = os.WriteFile(filepath.Join(dir, name), []byte("{}"), 0o600)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}
