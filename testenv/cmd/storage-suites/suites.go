package main

import (
	"fmt"
	"slices"
	"strings"
)

// A specSet names specs of e2e.test by ginkgo's --focus and --skip.
type specSet struct {
	name, focus, skip, about string
	// needsHostpath: the specs run csi-driver-host-path's driver (the
	// runner's -hostpathplugin).
	needsHostpath bool
}

// inTreeDrivers are the in-tree drivers of the storage testsuites that
// apply to one node (test/e2e/storage/drivers/in_tree.go): the ones that
// need a cloud (gce-localssd), an NFS server or Windows are left out.
const inTreeDrivers = `\[sig-storage\] In-tree Volumes \[Driver: (hostPath|hostPathSymlink|emptydir|local)\]`

// specSets are the sets a run can take (-set).
var specSets = []specSet{
	{
		name:  "default",
		focus: inTreeDrivers,
		// What upstream's presubmit storage jobs leave out: slow, serial
		// and disruptive specs (the disruptive ones restart the kubelet
		// through SSH), feature-gated ones, flaky ones.
		skip:  `\[Feature:|\[Disruptive\]|\[Flaky\]|\[Serial\]|\[Slow\]`,
		about: "the in-tree drivers' testsuites, as upstream's presubmit storage jobs run them",
	},
	{
		name:  "csi-mock",
		focus: `\[sig-storage\] CSI Mock`,
		skip:  `\[Feature:|\[Disruptive\]|\[Flaky\]|\[Serial\]|\[Slow\]`,
		about: "the CSI mock specs: the kubelet's calls to a CSI driver checked one by one, against Kubernetes' own mock driver",
	},
	{
		name:          "csi-hostpath",
		focus:         `\[sig-storage\] CSI Volumes \[Driver: csi-hostpath\]`,
		skip:          `\[Feature:|\[Disruptive\]|\[Flaky\]|\[Serial\]|\[Slow\]`,
		about:         "the testsuites against csi-driver-host-path deployed as pods with its sidecars, as kubernetes-csi certifies a driver",
		needsHostpath: true,
	},
	{
		name:          "csi-hostpath-slow",
		focus:         `\[sig-storage\] CSI Volumes \[Driver: csi-hostpath\].*\[(Slow|Serial)\]`,
		skip:          `\[Feature:|\[Disruptive\]|\[Flaky\]`,
		about:         "csi-hostpath's slow and serial specs (multiVolume, volume stress, volume limits, snapshots), which the csi-hostpath set leaves out",
		needsHostpath: true,
	},
	{
		name:  "all",
		focus: inTreeDrivers,
		skip:  `\[Feature:|\[Disruptive\]|\[Flaky\]`,
		about: "the in-tree drivers' testsuites with the slow and serial specs",
	},
}

func lookupSet(name string) (specSet, error) {
	i := slices.IndexFunc(specSets, func(s specSet) bool { return s.name == name })
	if i < 0 {
		var names []string
		for _, s := range specSets {
			names = append(names, s.name)
		}
		return specSet{}, fmt.Errorf("no spec set %q: one of %s", name, strings.Join(names, ", "))
	}
	return specSets[i], nil
}
