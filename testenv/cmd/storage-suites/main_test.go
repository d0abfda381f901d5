package main

import (
	"regexp"
	"testing"
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
