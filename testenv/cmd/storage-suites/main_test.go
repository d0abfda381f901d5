package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nodevol/nodevol/internal/roottest"
)

// TestSpecSets checks each set's expressions against spec texts of the
// cluster e2e suite v1.37.2: what each runs and what it leaves out.
func TestSpecSets(t *testing.T) {
	for _, tc := range []struct {
		set, spec string
		run       bool
	}{
		{"default", "[sig-storage] In-tree Volumes [Driver: local] [LocalVolumeType: dir] [Testpattern: Pre-provisioned PV (default fs)] subPath should support existing directory", true},
		{"default", "[sig-storage] In-tree Volumes [Driver: hostPathSymlink] [Testpattern: Inline-volume (default fs)] volumes should store data", true},
		{"default", "[sig-storage] In-tree Volumes [Driver: emptydir] [Testpattern: Inline-volume (default fs)] subPath should support readOnly directory specified in the volumeMount", true},
		{"default", "[sig-storage] In-tree Volumes [Driver: local] [LocalVolumeType: block] [Testpattern: Pre-provisioned PV (block volmode)] multiVolume [Slow] should access to two volumes with the same volume mode and retain data across pod recreation on the same node", false},
		{"default", "[sig-storage] In-tree Volumes [Driver: local] [LocalVolumeType: gce-localssd-scsi-fs] [Serial] [Testpattern: Pre-provisioned PV (default fs)] volumes should store data", false},
		{"default", "[sig-storage] In-tree Volumes [Driver: nfs] [Testpattern: Inline-volume (default fs)] volumes should store data", false},
		{"default", "[sig-storage] In-tree Volumes [Driver: hostPath] [Testpattern: Inline-volume (default fs)] subPath should unmount if pod is gracefully deleted while kubelet is down [Disruptive] [Slow] [LinuxOnly]", false},
		{"default", "[sig-storage] CSI Volumes [Driver: csi-hostpath] [Testpattern: Dynamic PV (default fs)] provisioning should provision storage with pvc data source", false},
		{"default", "[sig-storage] ConfigMap should be consumable from pods in volume [NodeConformance] [Conformance]", false},
		{"csi-mock", "[sig-storage] CSI Mock workload info CSI workload information using mock driver should be passed when podInfoOnMount=true", true},
		{"csi-mock", "[sig-storage] CSI Mock volume fsgroup policies CSI FSGroupPolicy [LinuxOnly] should modify fsGroup if fsGroupPolicy=File", true},
		{"csi-mock", "[sig-storage] In-tree Volumes [Driver: hostPathSymlink] [Testpattern: Inline-volume (default fs)] volumes should store data", false},
		{"csi-hostpath", "[sig-storage] CSI Volumes [Driver: csi-hostpath] [Testpattern: Dynamic PV (default fs)] provisioning should provision storage with pvc data source", true},
		{"csi-hostpath", "[sig-storage] CSI Volumes [Driver: csi-hostpath] [Testpattern: Dynamic PV (block volmode)] volumeMode should fail to use a volume in a pod with mismatched mode [Slow]", false},
		{"csi-hostpath-slow", "[sig-storage] CSI Volumes [Driver: csi-hostpath] [Testpattern: Dynamic PV (block volmode)] volumeMode should fail to use a volume in a pod with mismatched mode [Slow]", true},
		{"csi-hostpath-slow", "[sig-storage] CSI Volumes [Driver: csi-hostpath] [Testpattern: Dynamic PV (default fs)] provisioning should provision storage with pvc data source", false},
		{"csi-hostpath-slow", "[sig-storage] CSI Volumes [Driver: csi-hostpath] [Testpattern: Dynamic Snapshot (delete policy)] [Feature:VolumeSnapshotDataSource] [Slow] snapshottable should work", false},
		{"csi-hostpath", "[sig-storage] CSI Mock volume expansion CSI Volume expansion should expand volume by restarting pod if attach=on, nodeExpansion=on", false},
		{"all", "[sig-storage] In-tree Volumes [Driver: local] [LocalVolumeType: block] [Testpattern: Pre-provisioned PV (block volmode)] multiVolume [Slow] should access to two volumes with the same volume mode and retain data across pod recreation on the same node", true},
		{"all", "[sig-storage] In-tree Volumes [Driver: hostPath] [Testpattern: Inline-volume (default fs)] subPath should unmount if pod is gracefully deleted while kubelet is down [Disruptive] [Slow] [LinuxOnly]", false},
		{"all", "[sig-storage] In-tree Volumes [Driver: nfs] [Testpattern: Inline-volume (default fs)] volumes should store data", false},
	} {
		s, err := lookupSet(tc.set)
		if err != nil {
			t.Fatal(err)
		}
		run := regexp.MustCompile(s.focus).MatchString(tc.spec) && !regexp.MustCompile(s.skip).MatchString(tc.spec)
		if run != tc.run {
			t.Errorf("set %s runs %q: %v, want %v", tc.set, tc.spec, run, tc.run)
		}
	}
	if _, err := lookupSet("nope"); err == nil {
		t.Error("lookupSet(nope): no error")
	}
}

// TestCleanLocalDriverLeftovers: what the local volume specs made during a
// run and left (an interrupted spec) is taken down: the loop device on a
// backing file in a new directory detached, empty new directories
// removed; a directory that holds a file stays and is the error; one that
// was there before the run is not touched.
func TestCleanLocalDriverLeftovers(t *testing.T) {
	roottest.Require(t)
	base := t.TempDir()
	glob := filepath.Join(base, "local-driver-*")
	old := filepath.Join(base, "local-driver-old")
	if err := os.Mkdir(old, 0o755); err != nil {
		t.Fatal(err)
	}
	before, err := localDriverDirs(glob)
	if err != nil {
		t.Fatal(err)
	}
	empty, withFile := filepath.Join(base, "local-driver-a"), filepath.Join(base, "local-driver-b")
	for _, d := range []string{empty, withFile} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	backing := filepath.Join(withFile, "file")
	if err := os.WriteFile(backing, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "-f", "--show", backing).Output()
	if err != nil {
		t.Fatalf("losetup: %v", err)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", dev).Run() })

	cleaned, err := cleanLocalDriverLeftovers(glob, before)
	if err == nil || !strings.Contains(err.Error(), withFile) {
		t.Errorf("error %v, want one naming %s, which holds a file", err, withFile)
	}
	if want := []string{dev + " (" + backing + ")", empty}; !slices.Equal(cleaned, want) {
		t.Errorf("cleaned %q, want %q", cleaned, want)
	}
	if data, err := os.ReadFile("/sys/block/" + filepath.Base(dev) + "/loop/backing_file"); err == nil {
		t.Errorf("%s still backed by %s", dev, data)
	}
	for d, want := range map[string]bool{old: true, empty: false, withFile: true} {
		if _, err := os.Stat(d); (err == nil) != want {
			t.Errorf("%s there: %v, want %v", d, err == nil, want)
		}
	}
}

// TestDetachLoopsUnder: a loop device is known by its backing file's
// device and inode, not by the path it shows (a CSI driver's pod sets it
// up through the container's path): one set up through a hard link
// outside the directory is detached; one on a file elsewhere is not.
func TestDetachLoopsUnder(t *testing.T) {
	roottest.Require(t)
	base := t.TempDir()
	data, elsewhere := filepath.Join(base, "data"), filepath.Join(base, "elsewhere")
	for _, d := range []string{data, elsewhere} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	inside, other := filepath.Join(data, "vol"), filepath.Join(elsewhere, "other")
	for _, f := range []string{inside, other} {
		if err := os.WriteFile(f, make([]byte, 1<<20), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(elsewhere, "as-the-pod-saw-it")
	if err := os.Link(inside, link); err != nil {
		t.Fatal(err)
	}
	attach := func(path string) string {
		out, err := exec.Command("losetup", "-f", "--show", path).Output()
		if err != nil {
			t.Fatalf("losetup %s: %v", path, err)
		}
		dev := strings.TrimSpace(string(out))
		t.Cleanup(func() { _ = exec.Command("losetup", "-d", dev).Run() })
		return dev
	}
	devIn, devOther := attach(link), attach(other)
	detached, err := detachLoopsUnder(data)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{devIn + " (" + inside + ")"}; !slices.Equal(detached, want) {
		t.Errorf("detached %q, want %q", detached, want)
	}
	for dev, bound := range map[string]bool{devIn: false, devOther: true} {
		_, err := os.Stat("/sys/block/" + filepath.Base(dev) + "/loop/backing_file")
		if (err == nil) != bound {
			t.Errorf("%s bound: %v, want %v", dev, err == nil, bound)
		}
	}
}

// TestCheckHostpathVersion: a hostpathplugin is taken only when it says
// it is the version the manifests name.
func TestCheckHostpathVersion(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		says string
		ok   bool
	}{
		{"hostpathplugin v1.17.1", true},
		{"hostpathplugin ", false}, // built without -X main.version
		{"hostpathplugin v1.16.0", false},
	} {
		bin := filepath.Join(dir, "hostpathplugin")
		if err := os.WriteFile(bin, []byte("#!/bin/sh\necho '"+tc.says+"'\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := checkHostpathVersion(context.Background(), bin); (err == nil) != tc.ok {
			t.Errorf("says %q: error %v, want ok %v", tc.says, err, tc.ok)
		}
	}
}
