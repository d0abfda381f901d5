package csiplugin

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/klog/v2"

	"github.com/nodevol/nodevol/cache"
	"github.com/nodevol/nodevol/util/fsutil"
	"github.com/nodevol/nodevol/util/rootfs"
)

// FuzzLoadVolumeData checks LoadVolumeData on any vol_data.json content: it
// never panics; it either fails with an error that names the file and wraps
// fsutil.ErrCorrupt, or returns data with a non-empty volume handle and
// driver name; and what it returns, written back with saveVolumeData (as
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
		if err := (&Plugin{rfs: rfs}).saveVolumeData(dir, d); err != nil {
			t.Fatal(err)
		}
		again, err := ReadVolumeData(rfs, dir)
		if err != nil {
			t.Fatalf("loading what saveVolumeData wrote for %+v: %v", d, err)
		}
		if *again != *d {
			t.Fatalf("round trip changed %+v into %+v", d, again)
		}
	})
}

// FuzzSaveVolumeData checks saveVolumeData followed by LoadVolumeData for
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
		if err := (&Plugin{rfs: rfs}).saveVolumeData(dir, &in); err != nil {
			t.Fatalf("saveVolumeData(%+v): %v", in, err)
		}
		got, err := ReadVolumeData(rfs, dir)
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
// or the spec name; AttachmentName is always csi- and 64 hex digits, a
// valid object name.
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

		path, err = LegacyStagingPath(root, pvName)
		if (err == nil) != safeElement(pvName) {
			t.Fatalf("LegacyStagingPath(%q, %q) = %q, %v: wrong verdict on the PV name", root, pvName, path, err)
		}
		if err == nil {
			checkUnder(t, "LegacyStagingPath", root, path, with(csiDir, "pv", pvName, "globalmount")...)
		}

		// The pod's directory is named after the PV, or after the pod's
		// volume for an inline volume.
		dirName := VolumeDirName(&cache.VolumeSpec{PVName: pvName}, cache.PodVolume{SpecName: specName})
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

		name := AttachmentName(handle, driver, pvName)
		if !attachmentNameRE.MatchString(name) {
			t.Fatalf("AttachmentName(%q, %q, %q) = %q, not csi- and 64 hex digits", handle, driver, pvName, name)
		}
		if again := AttachmentName(handle, driver, pvName); again != name {
			t.Fatalf("AttachmentName is not deterministic: %q then %q", name, again)
		}
	})
}

var attachmentNameRE = regexp.MustCompile(`^csi-[0-9a-f]{64}$`)

// isDriverName is a CSI driver name by its definition, written out here
// rather than through the validation package: lowercased (ASCII only; the
// CSI spec allows [a-zA-Z0-9] with '-' and '.'), a DNS-1123 subdomain
// (dot-separated labels of [a-z0-9-], each non-empty and beginning and
// ending with a letter or digit) of at most 63 characters.
func isDriverName(name string) bool {
	if name == "" || len(name) > MaxDriverNameLength {
		return false
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
			if !alnum && (c != '-' || i == 0 || i == len(label)-1) {
				return false
			}
		}
	}
	return true
}

// oneDotX matches the versions ParseGeneric can read as 1.x: optional
// leading white space and "v", major 1 without leading zeros, a dot and
// a digit.
var oneDotX = regexp.MustCompile(`^[\t\n\f\r ]*v?1\.[0-9]`)

// FuzzValidatePlugin checks the registration handler's validation of a
// registrar's GetInfo answer (name, endpoint, versions, the latter split
// on commas) against a handler that already has a driver registered: it
// never panics; it never accepts a name that is not a CSI driver name (a
// DNS-1123 subdomain of at most 63 characters, letters in either case;
// so always a safe path element),
// an empty endpoint, or a version list without a 1.x; it accepts every
// valid answer for a new driver, and for the registered driver only a
// higher version; errors of a valid name name the driver.
func FuzzValidatePlugin(f *testing.F) {
	f.Add("csi.example.com", "/csi/csi.sock", "1.0.0")
	f.Add("csi.example.com", "/csi/csi.sock", "0.3.0,1.2.0,2.0.0")
	f.Add("CSI.Example.Com", "/csi/csi.sock", "v1.5.0")
	f.Add("registered.example.com", "/csi/r.sock", "1.2.0")
	f.Add("registered.example.com", "/csi/r.sock", "1.3.0")
	f.Add("registered.example.com", "/csi/r.sock", "1.2.0-beta,1.2")
	f.Add("csi.example.com", "", "1.0.0")
	f.Add("csi.example.com", "/csi/csi.sock", "")
	f.Add("csi.example.com", "/csi/csi.sock", "0.3.0,2.0.0,x,1,01.0, 1.0 ")
	f.Add("csi.example.com", "/csi/csi.sock", "1.99999999999999999999,1.0.99999999999999999999")
	f.Add("", "/csi/csi.sock", "1.0.0")
	f.Add("..", "/csi/csi.sock", "1.0.0")
	f.Add("a/b", "/csi/csi.sock", "1.0.0")
	f.Add("a..b", "/csi/csi.sock", "1.0.0")
	f.Add("-a.b", "/csi/csi.sock", "1.0.0")
	f.Add("a_b", "/csi/csi.sock", "1.0.0")
	f.Add("a^b", "/csi/csi.sock", "1.0.0")
	f.Add("\u212a.example.com", "/csi/csi.sock", "1.0.0") // Kelvin sign: strings.ToLower makes it "k"
	f.Add("d\x00", "/csi/csi.sock", "1.0.0")
	f.Add(strings.Repeat("a", 63), "/csi/csi.sock", "1.0.0")
	f.Add(strings.Repeat("a", 64), "/csi/csi.sock", "1.0.0")
	f.Add(strings.Repeat("\xff", 4096), strings.Repeat("/", 4096), strings.Repeat("1.", 2048))
	registered := version.MustParseGeneric("1.2.0")
	ctx := klog.NewContext(context.Background(), klog.Background().V(10)) // quiet
	reg := NewRegistry(RegistryOptions{})
	defer reg.Close()
	f.Fuzz(func(t *testing.T, name, endpoint, versionList string) {
		h, err := NewRegistrationHandler(RegistrationConfig{Registry: reg})
		if err != nil {
			t.Fatal(err)
		}
		h.drivers["registered.example.com"] = &registration{endpoint: "/csi/r.sock", version: registered}
		var versions []string
		if versionList != "" {
			versions = strings.Split(versionList, ",")
		}
		err = h.ValidatePlugin(ctx, name, endpoint, versions)
		has1x := slices.ContainsFunc(versions, oneDotX.MatchString)
		if err == nil {
			if !isDriverName(name) {
				t.Fatalf("accepted driver name %q, not a DNS-1123 subdomain of at most %d characters", name, MaxDriverNameLength)
			}
			if err := fsutil.ValidateName("driver name", name); err != nil {
				t.Fatalf("accepted driver name %q: %v", name, err)
			}
			if endpoint == "" {
				t.Fatalf("accepted driver %q with an empty endpoint", name)
			}
			if !has1x {
				t.Fatalf("accepted driver %q with versions %q: no 1.x", name, versions)
			}
			if name == "registered.example.com" {
				v, verr := HighestSupportedVersion(versions)
				if verr != nil || !registered.LessThan(v) {
					t.Fatalf("accepted %q at versions %q (highest %v, %v), registered at %s", name, versions, v, verr, registered)
				}
			}
			return
		}
		if isDriverName(name) && !strings.Contains(err.Error(), name) {
			t.Fatalf("error %q does not name driver %q", err, name)
		}
		if isDriverName(name) && endpoint != "" && name != "registered.example.com" {
			// A valid new driver is refused only for want of a 1.x version.
			if _, verr := HighestSupportedVersion(versions); verr == nil {
				t.Fatalf("refused valid driver %q at %q with versions %q: %v", name, endpoint, versions, err)
			}
		}
	})
}

// FuzzHighestSupportedVersion checks that the version HighestSupportedVersion
// picks is a 1.x listed in the input, and not lower than any other 1.x
// listed; that it fails exactly when none is listed.
func FuzzHighestSupportedVersion(f *testing.F) {
	for _, s := range []string{"1.0.0", "0.3.0,1.2.0,2.0.0", "v1.5.0", "1.2.0-beta,1.2", "", "x", "1", "01.0", " 1.0 ",
		"1.99999999999999999999", "1.2.3.4.5", "1.10,1.9", "1.0.0+meta,1.0.0", "v1.0, 1.1\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, list string) {
		versions := strings.Split(list, ",")
		got, err := HighestSupportedVersion(versions)
		var ones []*version.Version
		for _, s := range versions {
			if v, perr := version.ParseGeneric(s); perr == nil && v.Major() == 1 {
				ones = append(ones, v)
			}
		}
		if err != nil {
			if len(ones) > 0 {
				t.Fatalf("HighestSupportedVersion(%q) failed (%v) though %v is 1.x", versions, err, ones[0])
			}
			return
		}
		if got.Major() != 1 || !slices.ContainsFunc(versions, oneDotX.MatchString) {
			t.Fatalf("HighestSupportedVersion(%q) = %v, not a listed 1.x", versions, got)
		}
		for _, v := range ones {
			if got.LessThan(v) {
				t.Fatalf("HighestSupportedVersion(%q) = %v, lower than listed %v", versions, got, v)
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
			if rec != nil && !errors.Is(err, ErrRecordVersion) && !errors.Is(err, fsutil.ErrCorrupt) {
				t.Fatalf("error %v returned a record", err)
			}
			return
		}
		if rec.Dir != dir || rec.Version < 1 || rec.Version > RecordVersion || rec.Phase.Call() == "" || rec.Driver == "" || rec.VolumeHandle == "" {
			t.Fatalf("accepted a record that cannot be trusted: %+v", rec)
		}
		rs := &records{rfs: r, bootID: "boot"}
		again := *rec
		if err := rs.write(context.Background(), &again); err != nil {
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
