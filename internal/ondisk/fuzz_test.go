package ondisk

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/types"

	"github.com/nodevol/nodevol/internal/fsutil"
	"github.com/nodevol/nodevol/internal/rootfs"
	"github.com/nodevol/nodevol/podvol"
)

// FuzzLoadVolumeData checks LoadVolumeData on any vol_data.json content: it
// never panics; it either fails with an error that names the file and wraps
// fsutil.ErrCorrupt, or returns data with a non-empty volume handle and
// driver name; and what it returns, written back with WriteVolumeData (as
// the stager and mounter write it), loads again unchanged.
func FuzzLoadVolumeData(f *testing.F) {
	for _, s := range []string{
		`{"volumeHandle":"vol-1","driverName":"csi.example.com"}`,
		`{"specVolID":"pv-1","volumeHandle":"vol-1","driverName":"csi.example.com","nodeName":"node-1","attachmentID":"csi-0123","volumeLifecycleMode":"Persistent","seLinuxMountContext":""}`,
		`{"specVolID":"vol","volumeHandle":"csi-abc","driverName":"inline.example.com","volumeLifecycleMode":"Ephemeral"}`,
		`{"volumeHandle":"","driverName":"csi.example.com"}`,
		`{"volumeHandle":"vol-1"}`,
		`{"driverName":"csi.example.com"}`,
		`{"volumeHandle":null,"driverName":"d"}`,
		`{"volumeHandle":1,"driverName":"d"}`,
		`{"VOLUMEHANDLE":"v","DriverName":"d"}`,
		`{"volumeHandle":"v","driverName":"d","volumeHandle":""}`,
		`{"volumeHandle":"v\u0000","driverName":"../../d"}`,
		`{"volumeHandle":"\ud800","driverName":"d"}`,
		"{\"volumeHandle\":\"\xff\xfe\",\"driverName\":\"d\"}",
		`{"volumeHandle":"v","driverName":"d"}{"volumeHandle":"w","driverName":"d"}`,
		`{"volumeHandle":"v","driverName":"d"} `,
		`{"volumeHandle":"v","driverName":"d","extra":{"a":[1,2]}}`,
		`{"volumeHandle":"v","driverName":"d"`,
		`[]`, `null`, `""`, `{}`, ``, "\x00",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, content []byte) {
		dir := t.TempDir()
		path := filepath.Join(dir, VolumeDataFile)
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
		d, err := LoadVolumeData(dir)
		if err != nil {
			if d != nil {
				t.Fatalf("LoadVolumeData returned data %+v with error %v", d, err)
			}
			if !errors.Is(err, fsutil.ErrCorrupt) {
				t.Fatalf("error %v for an existing file does not wrap ErrCorrupt", err)
			}
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("error %q does not name the file %s", err, path)
			}
			return
		}
		if d.VolumeHandle == "" || d.DriverName == "" {
			t.Fatalf("accepted %q as %+v: volume handle or driver name empty", content, d)
		}
		// Reconstruction builds the staging path from what it read: it
		// stays in the driver's directory, or is refused.
		if p, err := StagingPath("/root", d.DriverName, d.VolumeHandle); err == nil {
			checkUnder(t, "StagingPath", "/root", p, "plugins", "kubernetes.io", "csi", d.DriverName, sha256Hex(d.VolumeHandle), "globalmount")
		} else if safeElement(d.DriverName) {
			t.Fatalf("StagingPath refused driver %q: %v", d.DriverName, err)
		}
		rfs, err := rootfs.New(dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := WriteVolumeData(rfs, dir, d); err != nil {
			t.Fatal(err)
		}
		again, err := readVolumeData(rfs, dir)
		if err != nil {
			t.Fatalf("loading what saveVolumeData wrote for %+v: %v", d, err)
		}
		if *again != *d {
			t.Fatalf("round trip changed %+v into %+v", d, again)
		}
	})
}

// FuzzSaveVolumeData checks WriteVolumeData followed by LoadVolumeData for
// any field values: the data loads back equal (strings coerced to valid
// UTF-8, as encoding/json writes them) when the handle and driver are set,
// and is refused as corrupt when either is empty; nothing but
// vol_data.json is left in the directory.
func FuzzSaveVolumeData(f *testing.F) {
	f.Add("pv-1", "vol-1", "csi.example.com", "node-1", "csi-0123", "Persistent", "")
	f.Add("", "vol-1", "csi.example.com", "", "", "", "")
	f.Add("vol", "csi-abc", "inline.example.com", "node-1", "", "Ephemeral", "system_u:object_r:container_file_t:s0:c1,c2")
	f.Add("", "", "csi.example.com", "", "", "", "")
	f.Add("", "vol-1", "", "", "", "", "")
	f.Add("\x00", "\xff\xfe", "d\"\\", "\u2028", "<>&", "\ud7ff", "\t\n")
	f.Add(strings.Repeat("x", 4096), strings.Repeat("\xc3", 4096), "d", "", "", "", "")
	f.Fuzz(func(t *testing.T, specVolID, handle, driver, node, attachID, mode, seLinux string) {
		dir := t.TempDir()
		in := VolumeData{SpecVolID: specVolID, VolumeHandle: handle, DriverName: driver, NodeName: node,
			AttachmentID: attachID, VolumeLifecycleMode: mode, SELinuxMountContext: seLinux}
		rfs, err := rootfs.New(dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := WriteVolumeData(rfs, dir, &in); err != nil {
			t.Fatalf("saveVolumeData(%+v): %v", in, err)
		}
		got, err := readVolumeData(rfs, dir)
		if handle == "" || driver == "" {
			if err == nil || !errors.Is(err, fsutil.ErrCorrupt) {
				t.Fatalf("loading %+v: got %+v, %v; want an ErrCorrupt error", in, got, err)
			}
		} else {
			if err != nil {
				t.Fatalf("loading %+v: %v", in, err)
			}
			want := VolumeData{SpecVolID: jsonString(specVolID), VolumeHandle: jsonString(handle), DriverName: jsonString(driver),
				NodeName: jsonString(node), AttachmentID: jsonString(attachID), VolumeLifecycleMode: jsonString(mode),
				SELinuxMountContext: jsonString(seLinux)}
			if *got != want {
				t.Fatalf("saved %+v, loaded %+v, want %+v", in, *got, want)
			}
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 1 || entries[0].Name() != VolumeDataFile {
			t.Fatalf("directory holds %v, want only %s", entries, VolumeDataFile)
		}
	})
}

// jsonString is s as encoding/json writes and reads it back: each byte
// that is not part of valid UTF-8 becomes U+FFFD.
func jsonString(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for len(s) > 0 {
		r, n := utf8.DecodeRuneInString(s)
		if r == utf8.RuneError && n == 1 {
			b.WriteRune(utf8.RuneError)
		} else {
			b.WriteString(s[:n])
		}
		s = s[n:]
	}
	return b.String()
}

// fuzzRoots are the kubelet roots the path fuzzer builds under: clean,
// with a trailing slash, the file system root, relative, and unclean.
var fuzzRoots = []string{"/var/lib/kubelet", "/var/lib/kubelet/", "/", "kubelet", "./a/../b", "/tmp/x/..", "/var//lib/kubelet"}

// safeElement is what a path element built from outside input must be, by
// its definition rather than fsutil's code: non-empty, not . or .., no
// slash, no NUL, and short enough for a file name.
func safeElement(s string) bool {
	return s != "" && s != "." && s != ".." && !strings.ContainsAny(s, "/\x00") && len(s) <= fsutil.MaxNameLength
}

// checkUnder fails unless path lies lexically inside root, holds no NUL,
// and its elements below root are exactly want.
func checkUnder(t *testing.T, what, root, path string, want ...string) {
	t.Helper()
	if strings.IndexByte(path, 0) >= 0 {
		t.Fatalf("%s %q holds a NUL byte", what, path)
	}
	rel, err := filepath.Rel(root, path)
	if err != nil {
		t.Fatalf("%s %q is not relative to root %q: %v", what, path, root, err)
	}
	if rel == "." || rel == ".." || strings.HasPrefix(rel, "../") || filepath.IsAbs(rel) {
		t.Fatalf("%s %q is not inside root %q (rel %q)", what, path, root, rel)
	}
	if got := strings.Split(rel, "/"); !slices.Equal(got, want) {
		t.Fatalf("%s %q has elements %q below root %q, want %q", what, path, got, root, want)
	}
}

// FuzzPaths checks every path builder on hostile names (.., /, NUL, 4 KiB
// strings, empty): each call either fails, exactly when a name that becomes
// a path element is not a safe element, or returns a path inside the root,
// without NUL, whose elements below the root are exactly the layout's (no
// separator smuggled in, nothing cleaned away). Volume handles, which are
// hashed, are accepted whatever they hold; VolumeDirName picks the PV name
// or the spec name.
func FuzzPaths(f *testing.F) {
	f.Add(uint8(0), "csi.example.com", "vol-1", "pv-1", "0f2c2b7e-uid", "pv-1")
	f.Add(uint8(1), "..", "../../etc", "..", "..", "..")
	f.Add(uint8(2), ".", "/", ".", ".", ".")
	f.Add(uint8(3), "a/b", "a/b", "a/../b", "uid/..", "x/y")
	f.Add(uint8(4), "d\x00", "\x00", "pv\x00", "u\x00id", "\x00")
	f.Add(uint8(5), "", "", "", "", "")
	f.Add(uint8(6), "...", "....", "...", ". ", " ..")
	f.Add(uint8(0), "d\\..", "h", `..\..`, "u", "~")
	f.Add(uint8(0), strings.Repeat("d", 4096), strings.Repeat("h", 4096), strings.Repeat("p", 4096), strings.Repeat("u", 4096), strings.Repeat("s", 4096))
	f.Add(uint8(0), strings.Repeat("d", 253), strings.Repeat("h", 4096), strings.Repeat("p", 254), strings.Repeat("u", 253), strings.Repeat("s", 253))
	f.Add(uint8(0), "csi.example.com", "vol-1", "", "uid", "inline-vol")
	f.Add(uint8(0), "csi.example.com", "vol-1", "pv-1", "", "pv-1")
	f.Add(uint8(0), "\xff\xfe", "\xff", "\u202e", "\n", "globalmount")
	f.Fuzz(func(t *testing.T, rootIdx uint8, driver, handle, pvName, podUID, specName string) {
		root := fuzzRoots[int(rootIdx)%len(fuzzRoots)]
		uid := types.UID(podUID)
		csiDir := []string{"plugins", "kubernetes.io", "csi"}
		with := func(base []string, more ...string) []string { return append(slices.Clone(base), more...) }
		sha := sha256Hex(handle)

		dir, err := StagingDir(root, driver, handle)
		if (err == nil) != safeElement(driver) {
			t.Fatalf("StagingDir(%q, %q, %q) = %q, %v: wrong verdict on the driver name", root, driver, handle, dir, err)
		}
		if err == nil {
			checkUnder(t, "StagingDir", root, dir, with(csiDir, driver, sha)...)
		}
		path, err := StagingPath(root, driver, handle)
		if (err == nil) != safeElement(driver) {
			t.Fatalf("StagingPath(%q, %q, %q) = %q, %v: wrong verdict on the driver name", root, driver, handle, path, err)
		}
		if err == nil {
			checkUnder(t, "StagingPath", root, path, with(csiDir, driver, sha, "globalmount")...)
		}

		path, err = legacyStagingPath(root, pvName)
		if (err == nil) != safeElement(pvName) {
			t.Fatalf("legacyStagingPath(%q, %q) = %q, %v: wrong verdict on the PV name", root, pvName, path, err)
		}
		if err == nil {
			checkUnder(t, "legacyStagingPath", root, path, with(csiDir, "pv", pvName, "globalmount")...)
		}

		// The pod's directory is named after the PV, or after the pod's
		// volume for an inline volume.
		dirName := VolumeDirName(&podvol.VolumeSpec{PVName: pvName}, podvol.PodVolume{SpecName: specName})
		if want := map[bool]string{true: pvName, false: specName}[pvName != ""]; dirName != want {
			t.Fatalf("VolumeDirName(PV %q, spec %q) = %q, want %q", pvName, specName, dirName, want)
		}
		podOK := safeElement(podUID) && safeElement(dirName)
		podDir := []string{"pods", podUID, "volumes", "kubernetes.io~csi", dirName}
		dir, err = PodVolumeDir(root, uid, dirName)
		if (err == nil) != podOK {
			t.Fatalf("PodVolumeDir(%q, %q, %q) = %q, %v: wrong verdict", root, podUID, dirName, dir, err)
		}
		if err == nil {
			checkUnder(t, "PodVolumeDir", root, dir, podDir...)
		}
		path, err = PodVolumePath(root, uid, dirName)
		if (err == nil) != podOK {
			t.Fatalf("PodVolumePath(%q, %q, %q) = %q, %v: wrong verdict", root, podUID, dirName, path, err)
		}
		if err == nil {
			checkUnder(t, "PodVolumePath", root, path, with(podDir, "mount")...)
		}

		bp, err := BlockVolumePaths(root, specName, uid)
		blockOK := safeElement(specName) && (podUID == "" || safeElement(podUID))
		if (err == nil) != blockOK {
			t.Fatalf("BlockVolumePaths(%q, %q, %q) = %+v, %v: wrong verdict", root, specName, podUID, bp, err)
		}
		if err == nil {
			devs := with(csiDir, "volumeDevices")
			checkUnder(t, "BlockPaths.Dir", root, bp.Dir, with(devs, specName)...)
			checkUnder(t, "BlockPaths.GlobalMapPath", root, bp.GlobalMapPath, with(devs, specName, "dev")...)
			checkUnder(t, "BlockPaths.DataDir", root, bp.DataDir, with(devs, specName, "data")...)
			checkUnder(t, "BlockPaths.StagingPath", root, bp.StagingPath, with(devs, "staging", specName)...)
			checkUnder(t, "BlockPaths.PublishDir", root, bp.PublishDir, with(devs, "publish", specName)...)
			if podUID == "" {
				if bp.PublishPath != "" || bp.PodDeviceDir != "" || bp.PodDevicePath != "" {
					t.Fatalf("BlockVolumePaths without a pod UID returned pod paths: %+v", bp)
				}
			} else {
				checkUnder(t, "BlockPaths.PublishPath", root, bp.PublishPath, with(devs, "publish", specName, podUID)...)
				checkUnder(t, "BlockPaths.PodDeviceDir", root, bp.PodDeviceDir, "pods", podUID, "volumeDevices", "kubernetes.io~csi")
				checkUnder(t, "BlockPaths.PodDevicePath", root, bp.PodDevicePath, "pods", podUID, "volumeDevices", "kubernetes.io~csi", specName)
			}
		}

	})
}

// FuzzReadRecord: any bytes in a record file either give an error (never
// a panic) or a record that names the directory it was read for, of a
// version this nodevol knows, with a known phase, a driver and a handle;
// and such a record, written again through the plugin's writer, reads
// back the same (save for the writer's version, boot ID and time).
func FuzzReadRecord(f *testing.F) {
	const dir = "pods/uid/volumes/kubernetes.io~csi/pv"
	for _, s := range []string{
		`{"version":1,"bootID":"b","phase":"Published","dir":"` + dir + `","driver":"d","volumeHandle":"h","mode":"Filesystem"}`,
		`{"version":1,"phase":"Staging","dir":"` + dir + `","driver":"d","volumeHandle":"h","publishContext":{"a":"b"},"mountOptions":["ro"],"nodeStageSecretRef":{"namespace":"n","name":"s"}}`,
		`{"version":2,"phase":"Published","dir":"` + dir + `","driver":"d","volumeHandle":"h"}`,
		`{"version":1,"phase":"Unknown","dir":"` + dir + `","driver":"d","volumeHandle":"h"}`,
		`{"version":1,"phase":"Published","dir":"../x","driver":"d","volumeHandle":"h"}`,
		`{"version":1,"phase":"Published","dir":"` + dir + `","driver":"d","volumeHandle":"h","time":"not a time"}`,
		`{"version":-1}`, `{"version":1e400}`, `[]`, `null`, ``, "\x00", `{"version":1,"phase":"Published"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, content []byte) {
		root := t.TempDir()
		r, err := rootfs.New(root)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.MkdirAll(filepath.Dir(RecordFile(dir)), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, RecordFile(dir)), content, 0o600); err != nil {
			t.Fatal(err)
		}
		rec, err := ReadRecord(r, dir)
		if err != nil {
			if rec != nil && !errors.Is(err, errRecordVersion) && !errors.Is(err, fsutil.ErrCorrupt) {
				t.Fatalf("error %v returned a record", err)
			}
			return
		}
		if rec.Dir != dir || rec.Version < 1 || rec.Version > recordVersion || rec.Phase.Call() == "" || rec.Driver == "" || rec.VolumeHandle == "" {
			t.Fatalf("accepted a record that cannot be trusted: %+v", rec)
		}
		rs := NewRecords(r, "boot")
		again := *rec
		if err := rs.Write(context.Background(), &again); err != nil {
			t.Fatalf("writing back %+v: %v", rec, err)
		}
		back, err := ReadRecord(r, dir)
		if err != nil {
			t.Fatalf("reading back: %v", err)
		}
		back.Version, back.BootID, back.Time = rec.Version, rec.BootID, rec.Time
		if !reflect.DeepEqual(normalize(*back), normalize(*rec)) {
			t.Fatalf("round trip changed the record:\n got %+v\nwant %+v", back, rec)
		}
	})
}

// normalize makes empty and nil maps and slices equal (JSON drops both).
func normalize(r Record) Record {
	if len(r.PublishContext) == 0 {
		r.PublishContext = nil
	}
	if len(r.MountOptions) == 0 {
		r.MountOptions = nil
	}
	return r
}
