package kubeletbench

import (
	"maps"
	"path/filepath"
	"slices"
	"testing"
)

// TestHandoverKindsKubeletToNodevol moves a node whose pods carry every
// kind of volume, an inline ephemeral CSI volume among them, from the
// kubelet to nodevol. The kubelet's volume
// manager (its plugins of every kind, real mounts) mounts two such pods,
// the test makes their subPath bind mounts as the kubelet makes them at
// container start and writes data, and the kubelet stops without tearing
// down. nodevol starts on the same root with one pod still wanted: its
// mounts (tmpfs, binds, the claim's) are kept with the same mount IDs, its
// data and the atomic-writer volumes' layout (the same ..data) are kept,
// preparing its subPaths again makes no new mount, and an update of its
// configMap is written in the kubelet's layout; the other pod is torn
// down, subPaths and all, its inline volume by NodeUnpublishVolume (the
// driver deletes it). Once the kept pod is deleted too nothing is
// left, and nodevol logged no error.
func TestHandoverKindsKubeletToNodevol(t *testing.T) {
	e := newEnv(t)
	e.kindsObjects()
	keep := e.kindsPod("kinds-keep", e.volume("k2n-kinds-keep", e.drivers[0], false))
	gone := e.kindsPod("kinds-gone", e.volume("k2n-kinds-gone", e.drivers[0], false))
	k := e.startKubelet(nil)
	k.mountPods(t, keep, gone)
	binds := map[*hvPod][]string{keep: k.prepareSubPaths(t, e, keep), gone: k.prepareSubPaths(t, e, gone)}
	e.writeKinds(t, binds)
	e.checkKinds(t, keep, binds[keep], "version=1\n")
	layout, normalized := e.kindsLayout(t, keep, false), e.kindsLayout(t, keep, true)
	volData := e.inlineVolData(t, keep)
	e.inlineVolData(t, gone)
	before := mountIDs(e.root)
	mark := len(e.calls(t, keep.vols[0].driver))
	e.stopKubelet()

	n := e.startNodevol([]*hvPod{keep})
	n.mountPods(t, keep)
	want := e.without(before, []*hvPod{gone})
	e.waitMounts(t, "nodevol tears down the pod no longer wanted", want)
	e.checkInlineUnpublished(t, gone, mark, "nodevol")
	e.checkInlineGone(t, gone)
	e.checkInlineKept(t, keep, volData, "nodevol")
	e.checkKinds(t, keep, binds[keep], "version=1\n")
	if got := e.kindsLayout(t, keep, false); !maps.Equal(withoutAPI(got, keep), withoutAPI(layout, keep)) {
		t.Errorf("nodevol changed the kubelet's layout of the volumes it took over:\n%s", diffLayout(withoutAPI(got, keep), withoutAPI(layout, keep)))
	}
	if again := n.prepareSubPaths(t, keep); !slices.Equal(again, binds[keep]) {
		t.Errorf("nodevol prepared the subPaths the kubelet made at %v, want %v", again, binds[keep])
	}
	e.waitMounts(t, "nodevol keeps the kubelet's subPath bind mounts", want)

	updateSettings(t, n.client, "version=2\n")
	e.waitConf(t, keep, "version=2\n", func() {})
	if got := e.kindsLayout(t, keep, true); !maps.Equal(got, normalized) {
		t.Errorf("nodevol wrote the configMap's update in a layout other than the kubelet's:\n%s", diffLayout(got, normalized))
	}
	checkLogs(t, "nodevol", n.log)

	n.deletePods(t, keep)
	e.stopNodevol()
	e.checkNothingLeft(t, nil, []*hvPod{keep, gone}, kindsLeaves([]*hvPod{keep, gone})...)
	e.checkInlineGone(t, keep)
}

// TestHandoverKindsNodevolToKubelet is the way back: nodevol mounts the
// two pods and makes their subPath bind mounts, the test writes their
// data, and nodevol stops without tearing down. The kubelet's volume
// manager starts on the same root with one pod in its pod manager: it
// reconstructs every kind from what nodevol left and keeps the pod's
// mounts (the same mount IDs), data and atomic-writer layout; preparing
// its subPaths again makes no new mount; an update of its configMap is
// written, in the layout nodevol wrote; the other pod is torn down (its
// inline volume by NodeUnpublishVolume, which deletes it). Once
// the kept pod is deleted too nothing is left, and the kubelet logged no
// error.
func TestHandoverKindsNodevolToKubelet(t *testing.T) {
	e := newEnv(t)
	e.kindsObjects()
	keep := e.kindsPod("kinds-keep", e.volume("n2k-kinds-keep", e.drivers[0], false))
	gone := e.kindsPod("kinds-gone", e.volume("n2k-kinds-gone", e.drivers[0], false))
	n := e.startNodevol([]*hvPod{keep, gone})
	n.mountPods(t, keep, gone)
	binds := map[*hvPod][]string{keep: n.prepareSubPaths(t, keep), gone: n.prepareSubPaths(t, gone)}
	e.writeKinds(t, binds)
	e.checkKinds(t, keep, binds[keep], "version=1\n")
	layout, normalized := e.kindsLayout(t, keep, false), e.kindsLayout(t, keep, true)
	volData := e.inlineVolData(t, keep)
	e.inlineVolData(t, gone)
	before := mountIDs(e.root)
	mark := len(e.calls(t, keep.vols[0].driver))
	e.stopNodevol()

	k := e.startKubelet([]*hvPod{keep})
	k.mountPods(t, keep)
	want := e.without(before, []*hvPod{gone})
	e.waitMounts(t, "the kubelet tears down the pod no longer wanted", want)
	e.checkInlineUnpublished(t, gone, mark, "the kubelet")
	e.checkInlineGone(t, gone)
	e.checkInlineKept(t, keep, volData, "the kubelet")
	e.checkKinds(t, keep, binds[keep], "version=1\n")
	if got := e.kindsLayout(t, keep, false); !maps.Equal(withoutAPI(got, keep), withoutAPI(layout, keep)) {
		t.Errorf("the kubelet changed nodevol's layout of the volumes it took over:\n%s", diffLayout(withoutAPI(got, keep), withoutAPI(layout, keep)))
	}
	if again := k.prepareSubPaths(t, e, keep); !slices.Equal(again, binds[keep]) {
		t.Errorf("the kubelet prepared the subPaths nodevol made at %v, want %v", again, binds[keep])
	}
	e.waitMounts(t, "the kubelet keeps nodevol's subPath bind mounts", want)

	updateSettings(t, k.client, "version=2\n")
	// The kubelet's pod workers make it look at a pod again on every sync.
	e.waitConf(t, keep, "version=2\n", func() { k.mountPods(t, keep) })
	if got := e.kindsLayout(t, keep, true); !maps.Equal(got, normalized) {
		t.Errorf("the kubelet wrote the configMap's update in a layout other than nodevol's:\n%s", diffLayout(got, normalized))
	}
	checkLogs(t, "the kubelet", k.log)

	k.deletePods(t, keep)
	k.waitUnstaged(t)
	e.waitMounts(t, "the kubelet unstages every volume", map[string]string{})
	e.stopKubelet()
	e.checkNothingLeft(t, []*hvPod{keep, gone}, nil, kindsLeaves([]*hvPod{keep, gone})...)
	e.checkInlineGone(t, keep)
}

// kindsLeaves is what is left of the kind volumes once their pods are
// gone, beside what leaves says of the claims: the plugin directories of
// each kind under pods/{uid}/volumes, and pods/{uid}/plugins/kubernetes.io~empty-dir
// (the secret's, configMap's, downwardAPI's and projected volume's
// wrapped emptyDirs were there). The kubelet and nodevol leave the same;
// the kubelet's housekeeping removes them with the pod's directory.
func kindsLeaves(pods []*hvPod) []string {
	var out []string
	for _, p := range pods {
		dir := filepath.Join("pods", string(p.uid()))
		out = append(out, filepath.Join(dir, "plugins"), filepath.Join(dir, "plugins", "kubernetes.io~empty-dir"))
		for _, kind := range kindDirs {
			out = append(out, filepath.Join(dir, "volumes", kind))
		}
	}
	return out
}
