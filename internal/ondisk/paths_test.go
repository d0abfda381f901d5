package ondisk

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/internal/fsutil"
	"github.com/nodevol/nodevol/internal/rootfs"
	"github.com/nodevol/nodevol/podvol"
)

func TestPaths(t *testing.T) {
	const root = "/var/lib/kubelet"
	got, err := StagingPath(root, "csi.example.com", "vol-1")
	if err != nil {
		t.Fatal(err)
	}
	if want := "/var/lib/kubelet/plugins/kubernetes.io/csi/csi.example.com/d2e8363faaac7ae76def3b14091d8eb5755f6b92e9531627aeec833a8731cc49/globalmount"; got != want {
		t.Errorf("StagingPath = %s, want %s", got, want)
	}
	got, err = PodVolumePath(root, "uid-1", "pv-1")
	if err != nil {
		t.Fatal(err)
	}
	if want := "/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~csi/pv-1/mount"; got != want {
		t.Errorf("PodVolumePath = %s, want %s", got, want)
	}
	got, err = legacyStagingPath(root, "pv-1")
	if err != nil {
		t.Fatal(err)
	}
	if want := "/var/lib/kubelet/plugins/kubernetes.io/csi/pv/pv-1/globalmount"; got != want {
		t.Errorf("legacyStagingPath = %s, want %s", got, want)
	}
	// A hostile volume handle only ever appears hashed.
	got, err = StagingPath(root, "d", "../../../../etc")
	if err != nil || filepath.Dir(filepath.Dir(got)) != filepath.Join(root, "plugins/kubernetes.io/csi/d") {
		t.Errorf("StagingPath with a hostile handle = %s, %v", got, err)
	}
}

func TestPathsRejectHostileNames(t *testing.T) {
	for _, bad := range []string{"", ".", "..", "a/b", "../x", "/abs", "a\x00b"} {
		if _, err := StagingPath("/r", bad, "h"); err == nil {
			t.Errorf("StagingPath accepted driver %q", bad)
		}
		if _, err := PodVolumePath("/r", types.UID(bad), "s"); err == nil {
			t.Errorf("PodVolumePath accepted pod UID %q", bad)
		}
		if _, err := PodVolumePath("/r", "u", bad); err == nil {
			t.Errorf("PodVolumePath accepted spec name %q", bad)
		}
		if _, err := legacyStagingPath("/r", bad); err == nil {
			t.Errorf("legacyStagingPath accepted PV name %q", bad)
		}
	}
}

func TestVolumeDirName(t *testing.T) {
	vol := podvol.PodVolume{SpecName: "data"}
	if got := VolumeDirName(&podvol.VolumeSpec{PVName: "pv-1"}, vol); got != "pv-1" {
		t.Errorf("PV volume: %q, want the PV name, as the kubelet", got)
	}
	if got := VolumeDirName(&podvol.VolumeSpec{Ephemeral: true}, vol); got != "data" {
		t.Errorf("inline volume: %q, want the pod's volume name", got)
	}
}

func TestLoadVolumeData(t *testing.T) {
	dir := t.TempDir()
	write := func(content string) {
		if err := os.WriteFile(filepath.Join(dir, VolumeDataFile), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := LoadVolumeData(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	// Written by a kubelet: a map of strings, with keys nodevol does not know.
	write(`{"attachmentID":"csi-1","driverName":"d","nodeName":"n","specVolID":"pv-1","volumeHandle":"h","volumeLifecycleMode":"Persistent","future":"x"}`)
	d, err := LoadVolumeData(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := VolumeData{SpecVolID: "pv-1", VolumeHandle: "h", DriverName: "d", NodeName: "n", AttachmentID: "csi-1", VolumeLifecycleMode: "Persistent"}
	if *d != want {
		t.Errorf("LoadVolumeData = %+v, want %+v", *d, want)
	}
	for _, bad := range []string{`{"driverName":"d"}`, `{"volumeHandle":"h"}`, `{"volumeHandle":1}`, `{`} {
		write(bad)
		if _, err := LoadVolumeData(dir); !errors.Is(err, fsutil.ErrCorrupt) {
			t.Errorf("LoadVolumeData(%s) = %v, want ErrCorrupt", bad, err)
		}
	}
}

// TestWriteVolumeDataIn: written once in a directory just made, the file
// is byte for byte and mode for mode what WriteVolumeData writes (what the
// kubelet reads); in a directory found, or where one appeared meanwhile,
// it replaces what is there (a symlink too, never written through).
func TestWriteVolumeDataIn(t *testing.T) {
	base := t.TempDir()
	r, err := rootfs.New(filepath.Join(base, "root"))
	if err != nil {
		t.Fatal(err)
	}
	d := &VolumeData{SpecVolID: "pv", VolumeHandle: "h", DriverName: "d", NodeName: "n", AttachmentID: "a", VolumeLifecycleMode: "Persistent"}
	if err := r.MkdirAll("old", 0o750); err != nil {
		t.Fatal(err)
	}
	if err := WriteVolumeData(r, "old", d); err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(filepath.Join(r.Path(), "old", VolumeDataFile))
	wantFi, _ := os.Stat(filepath.Join(r.Path(), "old", VolumeDataFile))
	outside := filepath.Join(base, "outside")
	if err := os.WriteFile(outside, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		made  bool
		plant func(path string) error
	}{
		{"made", true, nil},
		{"made, one there meanwhile", true, func(p string) error { return os.WriteFile(p, []byte("{}"), 0o600) }},
		{"found", false, func(p string) error { return os.WriteFile(p, []byte("{}"), 0o600) }},
		{"found, a symlink there", false, func(p string) error { return os.Symlink(outside, p) }},
		{"made, a symlink there", true, func(p string) error { return os.Symlink(outside, p) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(r.Path(), tc.name)
			if err := os.Mkdir(dir, 0o750); err != nil {
				t.Fatal(err)
			}
			if tc.plant != nil {
				if err := tc.plant(filepath.Join(dir, VolumeDataFile)); err != nil {
					t.Fatal(err)
				}
			}
			sub, err := r.Sub(tc.name)
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()
			if err := WriteVolumeDataIn(sub, tc.made, d); err != nil {
				t.Fatal(err)
			}
			got, _ := os.ReadFile(filepath.Join(dir, VolumeDataFile))
			fi, err := os.Lstat(filepath.Join(dir, VolumeDataFile))
			if string(got) != string(want) || err != nil || fi.Mode() != wantFi.Mode() {
				t.Errorf("wrote %q (%v, %v), want %q (%v)", got, fi.Mode(), err, want, wantFi.Mode())
			}
			if b, _ := os.ReadFile(outside); string(b) != "keep" {
				t.Errorf("written through a symlink: outside holds %q", b)
			}
		})
	}
}
