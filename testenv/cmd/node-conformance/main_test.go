package main

import (
	"regexp"
	"testing"
)

// TestSuites checks each suite's expressions against spec texts of the
// node e2e suite v1.37.2: what each runs and what it leaves out.
func TestSuites(t *testing.T) {
	for _, tc := range []struct {
		suite, spec string
		run         bool
	}{
		{"storage", "[sig-storage] ConfigMap should be consumable from pods in volume with mappings [Conformance] [NodeConformance]", true},
		{"storage", "[sig-storage] Downward API [Feature:EphemeralStorage] Downward API tests for local ephemeral storage should provide default limits.ephemeral-storage from node allocatable [Disruptive] [Serial]", true},
		{"storage", "[sig-node] Kubelet Volume Manager Volume Manager On termination of pod with memory backed volume should remove the volume from the node [NodeConformance]", true},
		{"storage", "[sig-node] Pod conditions managed by Kubelet [NodeConformance] a pod failing to mount volumes (Secret) and with init containers should report just the scheduled condition set", true},
		{"storage", "[sig-node] ImageVolume [Feature:ImageVolume] subPath should succeed when using a valid subPath", true},
		{"storage", "[sig-node] Variable Expansion should allow substituting values in a volume subpath [Conformance]", true},
		{"storage", "[sig-storage] EmptyDir volumes EmptyDirVolumeMode [LinuxOnly] [Feature:EmptyDirVolumeMode] [FeatureGate:EmptyDirVolumeMode] should set mode 0750 on emptyDir directory [Alpha] [Feature:OffByDefault]", false},
		{"storage", "[sig-node] Pods should be submitted and removed [NodeConformance] [Conformance]", false},
		{"conformance", "[sig-node] Pods should be submitted and removed [NodeConformance] [Conformance]", true},
		{"conformance", "[sig-node] ImageVolume [Feature:ImageVolume] subPath should succeed when using a valid subPath", false},
		{"conformance", "[sig-node] Pods should have their auto-restart back-off timer reset on image update [NodeConformance] [Slow]", false},
		{"conformance", "[sig-node] MirrorPod when create a mirror pod without changes should successfully recreate when file is removed and recreated [NodeConformance] [Serial]", false},
		{"conformance-slow", "[sig-node] Pods should have their auto-restart back-off timer reset on image update [NodeConformance] [Slow]", true},
		{"conformance-slow", "[sig-node] PLR Pod InPlace Resize [FeatureGate:InPlacePodLevelResourcesVerticalScaling] PLR guaranteed qos - 1 container with resize policy [Environment:NotInUserNS] mem restart resizing [It] only pod-level mem [Beta] [NodeConformance] [Slow]", true},
		{"conformance-slow", "[sig-node] MirrorPod when create a mirror pod without changes should successfully recreate when file is removed and recreated [NodeConformance] [Serial]", true},
		{"conformance-slow", "[sig-node] Pods should be submitted and removed [NodeConformance] [Conformance]", false},
		{"conformance-slow", "[sig-node] LocalStorageEviction [Slow] [Serial] [Disruptive] [NodeFeature:Eviction] when we run containers that should cause DiskPressure  should eventually evict all of the correct pods", false},
		{"conformance-slow", "[sig-node] Some [Slow] [NodeConformance] spec [Flaky]", false},
		{"disruptive", "[sig-node] LocalStorageCapacityIsolationEviction [Feature:LocalStorageCapacityIsolationQuota] [Feature:Eviction] when we run containers that should cause evictions due to pod local storage violations  should eventually evict all of the correct pods [Disruptive] [Serial] [Slow]", false},
		{"eviction", "[sig-node] LocalStorageCapacityIsolationEviction [Feature:LocalStorageCapacityIsolationQuota] [Feature:Eviction] when we run containers that should cause evictions due to pod local storage violations  should eventually evict all of the correct pods [Disruptive] [Serial] [Slow]", true},
		{"eviction", "[sig-node] LocalStorageSoftEviction [Feature:Eviction] when we run containers that should cause DiskPressure  should eventually evict all of the correct pods [Disruptive] [Serial] [Slow]", true},
		{"eviction", "[sig-node] PriorityMemoryEvictionOrdering [Feature:Eviction] when we run containers that should cause MemoryPressure  should eventually evict all of the correct pods [Disruptive] [Serial] [Slow]", false},
		{"eviction", "[sig-node] LocalStorageCapacityIsolationFSQuotaMonitoring [Feature:LocalStorageCapacityIsolationQuota] [Feature:LSCIQuotaMonitoring] [Feature:UserNamespacesSupport] when we run containers that should cause use quotas for LSCI monitoring (quotas enabled: true, userNamespacesEnabled: false)  should eventually evict all of the correct pods [Disruptive] [Serial] [Slow]", false},
		{"disruptive", "[sig-node] Unknown Pods when creating a mirror pod the static pod should be terminated and cleaned up due to becoming a unknown pod due to being force deleted while kubelet is not running [Disruptive] [Serial]", true},
		{"disruptive", "[sig-node] Restart Kubelet should correctly account for terminated pods after restart [Disruptive] [Serial] [Slow]", true},
		{"disruptive", "[sig-node] LocalStorageCapacityIsolationFSQuotaMonitoring [Feature:LocalStorageCapacityIsolationQuota] [Feature:LSCIQuotaMonitoring] [Feature:UserNamespacesSupport] when we run containers that should cause use quotas for LSCI monitoring (quotas enabled: true, userNamespacesEnabled: false)  should eventually evict all of the correct pods [Disruptive] [Serial] [Slow]", false},
		{"disruptive", "[sig-node] PriorityMemoryEvictionOrdering [Feature:Eviction] when we run containers that should cause MemoryPressure  should eventually evict all of the correct pods [Disruptive] [Serial] [Slow]", false},
	} {
		s, err := lookupSuite(tc.suite)
		if err != nil {
			t.Fatal(err)
		}
		run := regexp.MustCompile(s.focus).MatchString(tc.spec) && !regexp.MustCompile(s.skip).MatchString(tc.spec)
		if run != tc.run {
			t.Errorf("suite %s runs %q: %v, want %v", tc.suite, tc.spec, run, tc.run)
		}
	}
	if _, err := lookupSuite("nope"); err == nil {
		t.Error("lookupSuite(nope): no error")
	}
}
