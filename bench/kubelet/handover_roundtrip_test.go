package kubeletbench

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// roundTripPods is the number of pods of TestHandoverRoundTrip, each with
// a volume of its own: every tenth a raw block volume, every tenth (other)
// one of the driver with attach required.
const roundTripPods = 100

// TestHandoverRoundTrip moves a loaded node from the kubelet to nodevol
// and back, with pods deleted and added at each hand-over, as happens
// while a node agent is rolled out and rolled back. The kubelet mounts 80
// pods; nodevol takes over with 10 of them deleted and 10 new ones; the
// kubelet takes over again with 10 more deleted and the last 10 added.
// At each hand-over the pods that stay keep their mounts (the same mount
// IDs) and data; in the end the kubelet tears everything down to nothing.
func TestHandoverRoundTrip(t *testing.T) {
	e := newEnv(t)
	pods := make([]*hvPod, roundTripPods)
	for i := range pods {
		drv, block := e.drivers[0], i%10 == 9
		if i%10 == 8 {
			drv = e.drivers[1]
		}
		pods[i] = e.pod(fmt.Sprintf("rt-%d", i), e.volume(fmt.Sprintf("rt-%d", i), drv, block))
	}
	first, firstGone, second := pods[:80], pods[:10], pods[80:90]
	atNodevol := pods[10:90]
	secondGone, third := pods[10:20], pods[90:]
	atKubelet := pods[20:]

	k := e.startKubelet(nil)
	start := time.Now()
	k.mountPods(t, first...)
	t.Logf("the kubelet mounted %d pods in %v", len(first), time.Since(start))
	e.writeData(t, first)
	before := mountIDs(e.root)
	e.stopKubelet()

	start = time.Now()
	a := e.startAgent(atNodevol)
	a.expect(t, "SYNCED")
	a.expect(t, fmt.Sprintf("READY %d", len(atNodevol)))
	e.waitHandover(t, "kubelet -> nodevol", before, firstGone, second)
	t.Logf("nodevol took %d pods over, tore %d down and mounted %d in %v", len(atNodevol)-len(second), len(firstGone), len(second), time.Since(start))
	e.checkData(t, pods[10:80])
	e.writeData(t, second)
	before = mountIDs(e.root)
	e.stopAgent()

	start = time.Now()
	k = e.startKubelet(atKubelet)
	k.mountPods(t, atKubelet...)
	e.waitHandover(t, "nodevol -> kubelet", before, secondGone, third)
	t.Logf("the kubelet took %d pods over, tore %d down and mounted %d in %v", len(atKubelet)-len(third), len(secondGone), len(third), time.Since(start))
	e.checkData(t, pods[20:90])
	e.writeData(t, third)
	e.checkData(t, third)

	k.deletePods(t, atKubelet...)
	k.waitUnstaged(t)
	e.waitMounts(t, "the kubelet unstages every volume", map[string]string{})
	e.stopKubelet()
	e.checkNothingLeft(t, pods[10:], firstGone)
}

// waitHandover waits until the mount table under the root is before
// without the gone pods' mounts (those kept with the same mount IDs), with
// the added pods' volumes staged and published, and the gone pods'
// teardown finished: their volumes' directories removed (unfinished). The
// mount table alone is right too early: a staging mount goes inside
// NodeUnstageVolume, which then still detaches the device, and only its
// answer lets the owner remove the directories. An owner stopped then cuts
// the call off (nodevol's agent-fake has no shutdown grace period) and
// leaves a half-unstaged volume that the other side never finds, since
// the kubelet reconstructs from pod directories only.
func (e *hvEnv) waitHandover(t *testing.T, what string, before map[string]string, gone, added []*hvPod) {
	t.Helper()
	kept := e.without(before, gone)
	isAdded := func(path string) bool {
		for _, p := range added {
			if namesPod(path, p) || strings.HasPrefix(path, e.staging(p.vols[0])) {
				return true
			}
		}
		return false
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		got := mountIDs(e.root)
		var wrong []string
		for path, id := range kept {
			if got[path] != id {
				wrong = append(wrong, fmt.Sprintf("kept %s: IDs %q, want %q", rel(e.root, path), got[path], id))
			}
		}
		for path := range got {
			if _, k := kept[path]; !k && !isAdded(path) {
				wrong = append(wrong, "unexpected "+rel(e.root, path))
			}
		}
		for _, p := range e.unfinished(t, gone) {
			wrong = append(wrong, "not torn down "+p)
		}
		for _, p := range added {
			v := p.vols[0]
			if _, ok := got[e.target(p, v)]; !ok {
				wrong = append(wrong, "not published "+rel(e.root, e.target(p, v)))
			}
			if _, ok := got[e.staging(v)]; !ok && !v.block { // a block volume's staging path is the driver's, not a mount here
				wrong = append(wrong, "not staged "+rel(e.root, e.staging(v)))
			}
		}
		if len(wrong) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the mount table under the root is not as expected:\n  %s", what, strings.Join(wrong, "\n  "))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
