package main

import (
	"fmt"
	"slices"
	"strings"
)

// suite is a set of the node e2e suite's specs a run focuses on.
type suite struct {
	// focus and skip are ginkgo's regular expressions over the spec text.
	focus, skip string
}

// skipAlways are specs no run here takes: alpha features and those off by
// default in v1.37.2 (upstream runs them only in jobs that turn their gate
// on), and specs upstream itself marks flaky.
const skipAlways = `\[Alpha\]|\[Feature:OffByDefault\]|\[Flaky\]`

// slowOrSerial are the tags of the specs upstream's node conformance job
// leaves to jobs of their own: the slow ones and those that must run alone.
const slowOrSerial = `\[Slow\]|\[Serial\]`

// storageSpecs are the specs of the node e2e suite that go through the
// kubelet's volume path outside [sig-storage]: the volume manager's own,
// pods that fail to mount, image volumes, subPath expansion, the stats
// summary (volume usage), a static pod whose volume fails to unmount,
// hugepages emptyDirs and the env files read from an emptyDir.
var storageSpecs = []string{
	`Kubelet Volume Manager`,
	`a pod failing to mount volumes`,
	`ImageVolume`,
	`Variable Expansion .*subpath`,
	`Summary API when querying /stats/summary should report resource usage`,
	`MirrorPod when recreating a static pod`,
	`HugePages \[Feature:HugePages\]`,
	`FileKeyRef`,
}

// suites are the runs make test-node-conformance knows (NODE_SUITE).
var suites = map[string]suite{
	// storage: every [sig-storage] spec (the node conformance ones and the
	// features that apply here), and storageSpecs.
	"storage": {focus: `\[sig-storage\]|` + strings.Join(storageSpecs, "|"), skip: skipAlways},
	// conformance: upstream's node conformance job, every
	// [NodeConformance] spec but the slow and serial ones.
	"conformance": {focus: `\[NodeConformance\]`, skip: skipAlways + `|` + slowOrSerial},
	// conformance-slow: the rest of [NodeConformance], the slow and serial
	// specs upstream runs in jobs of their own (most are in-place resizes
	// of pod-level resources).
	"conformance-slow": {focus: `\[NodeConformance\].*(` + slowOrSerial + `)|(` + slowOrSerial + `).*\[NodeConformance\]`, skip: skipAlways},
	// disruptive: the serial and disruptive specs about the volume path
	// that apply on one node, but eviction: the kubelet restarted with
	// pods running, a static pod force-deleted while the kubelet is down,
	// and the downward API's ephemeral storage. Those that need user
	// namespaces (containerd 1.6 has none) are left out.
	"disruptive": {focus: strings.Join(disruptiveSpecs, "|"), skip: skipAlways + `|UserNamespacesSupport`},
	// eviction: local ephemeral storage eviction, under disk and inode
	// pressure, by priority, and for emptyDir sizeLimits; each spec takes
	// about a quarter of an hour.
	"eviction": {focus: strings.Join(evictionSpecs, "|"), skip: skipAlways + `|UserNamespacesSupport`},
}

// disruptiveSpecs are the disruptive suite's specs.
var disruptiveSpecs = []string{
	`Restart Kubelet`,
	`Unknown Pods`,
	`Downward API \[Feature:EphemeralStorage\]`,
}

// evictionSpecs are the eviction suite's specs.
var evictionSpecs = []string{
	`LocalStorageCapacityIsolationEviction`,
	`LocalStorageEviction`,
	`LocalStorageSoftEviction`,
	`PriorityLocalStorageEvictionOrdering`,
	`InodeEviction`,
}

// suiteNames lists the suites' names, sorted.
func suiteNames() []string {
	var names []string
	for n := range suites {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// lookupSuite is the suite named name, or an error naming the known ones.
func lookupSuite(name string) (suite, error) {
	s, ok := suites[name]
	if !ok {
		return suite{}, fmt.Errorf("no suite %q: want one of %v", name, suiteNames())
	}
	return s, nil
}
