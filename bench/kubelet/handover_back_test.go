package kubeletbench

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestHandoverNodevolKubeletNodevol moves a node from nodevol to the
// kubelet and back to nodevol, with a volume the kubelet unstaged and
// staged again meanwhile: its staging directory is the one nodevol
// recorded before, made again by the kubelet. nodevol, back, takes every
// pod over with its mounts as they are (the same mount IDs) and its data,
// removes its records of the directories that went, and in the end tears
// everything down to nothing.
func TestHandoverNodevolKubeletNodevol(t *testing.T) {
	e := newEnv(t)
	plain := e.drivers[0]
	restaged := e.volume("back-restaged", plain, false)
	first := e.pod("back-first", restaged)
	kept := e.pod("back-kept", e.volume("back-kept", plain, false), e.volume("back-blk", plain, true))
	a := e.startAgent([]*hvPod{first, kept})
	a.expect(t, "SYNCED")
	a.expect(t, "READY 2")
	e.writeData(t, []*hvPod{first, kept})
	e.stopAgent()

	k := e.startKubelet([]*hvPod{first, kept})
	k.mountPods(t, first, kept)
	k.deletePods(t, first)
	staging := e.staging(restaged)
	e.waitFor("the kubelet to unstage "+restaged.name, 2*time.Minute, func() bool {
		_, err := os.Lstat(filepath.Dir(staging))
		return os.IsNotExist(err)
	})
	second := e.pod("back-second", restaged)
	k.mountPods(t, second)
	e.checkData(t, []*hvPod{kept})
	if got, err := os.ReadFile(filepath.Join(e.target(second, restaged), first.name+".txt")); err != nil || string(got) != string(dataOf(first, restaged)) {
		t.Fatalf("the volume staged again reads %q, %v; want what the first pod wrote", got, err)
	}
	e.writeData(t, []*hvPod{second})
	before := mountIDs(e.root)
	e.stopKubelet()
	stale := false
	for _, r := range e.records(t) {
		stale = stale || r.dir == rel(e.root, filepath.Dir(staging))
	}
	if !stale {
		t.Fatalf("no record of nodevol's names %s: the test proves nothing", rel(e.root, filepath.Dir(staging)))
	}

	a = e.startAgent([]*hvPod{second, kept})
	a.expect(t, "SYNCED")
	a.expect(t, "READY 2")
	e.waitMounts(t, "nodevol takes every pod over", before)
	e.checkData(t, []*hvPod{second, kept})
	for _, r := range e.records(t) {
		if _, err := os.Lstat(filepath.Join(e.root, r.dir)); os.IsNotExist(err) {
			t.Errorf("nodevol came back and kept its record %s of %s, which is gone", rel(e.root, r.file), r.dir)
		}
	}
	a.send(t, "delete-all")
	a.expect(t, "UNMOUNTED")
	e.stopAgent()
	e.checkNothingLeft(t, []*hvPod{first}, []*hvPod{second, kept})
}
