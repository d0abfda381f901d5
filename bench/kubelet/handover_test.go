package kubeletbench

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestHandoverKubeletToNodevol moves a node from the kubelet to nodevol
// without draining it. The kubelet's volume manager (v1.37.2, its CSI
// plugin, real mounts) mounts pods' volumes: filesystem, raw block, one
// volume shared by two pods, volumes of a driver with attach required;
// the pods write their data, and the kubelet stops without tearing down.
// nodevol starts on the same root with only some of the pods still
// wanted: their mounts are kept as they are (the same mount IDs) with
// their data; the other pods' volumes are unpublished and unstaged; in the
// end nothing is left but what the kubelet itself leaves.
func TestHandoverKubeletToNodevol(t *testing.T) {
	e := newEnv(t)
	keep, gone := e.mixedPods("k2n")
	k := e.startKubelet(nil)
	k.mountPods(t, append(keep, gone...)...)
	e.writeData(t, append(keep, gone...))
	before := mountIDs(e.root)
	e.stopKubelet()

	a := e.startAgent(keep)
	a.expect(t, "SYNCED")
	a.expect(t, fmt.Sprintf("READY %d", len(keep)))
	e.waitMounts(t, "nodevol tears down the pods no longer wanted", e.without(before, gone))
	e.checkData(t, keep)

	a.send(t, "delete-all")
	a.expect(t, "UNMOUNTED")
	e.stopAgent()
	e.checkNothingLeft(t, nil, append(keep, gone...))
}

// TestHandoverNodevolToKubelet is the way back: nodevol mounts the same
// kinds of volumes, the pods write their data, and nodevol stops without
// tearing down. The kubelet's volume manager starts on the same root with
// only some of the pods in its pod manager: it reconstructs the volumes
// from what nodevol wrote, keeps the wanted pods' mounts as they are with
// their data, and tears down the others; once it has torn down the rest,
// nothing is left but what it leaves by itself.
func TestHandoverNodevolToKubelet(t *testing.T) {
	e := newEnv(t)

	keep, gone := e.mixedPods("n2k")
	all := append(keep, gone...)
	a := e.startAgent(all)
	a.expect(t, "SYNCED")
	a.expect(t, fmt.Sprintf("READY %d", len(all)))
	e.writeData(t, all)
	before := mountIDs(e.root)
	e.stopAgent()

	k := e.startKubelet(keep)
	k.mountPods(t, keep...)
	e.waitMounts(t, "the kubelet tears down the pods no longer wanted", e.without(before, gone))
	e.checkData(t, keep)

	k.deletePods(t, keep...)
	k.waitUnstaged(t)
	e.waitMounts(t, "the kubelet unstages every volume", map[string]string{})
	e.stopKubelet()
	e.checkNothingLeft(t, all, nil)

	// nodevol's records of the volumes it had set up stay under
	// {root}/nodevol, which the kubelet ignores; when nodevol comes back it
	// removes those of directories that are gone.
	if len(e.records(t)) == 0 {
		t.Fatal("no record of nodevol's is left for the kubelet's time: the test proves nothing below")
	}
	a = e.startAgent(nil)
	a.expect(t, "SYNCED")
	a.expect(t, "READY 0")
	e.stopAgent()
	if left := e.records(t); len(left) > 0 {
		t.Errorf("nodevol came back and left the records of directories that are gone: %v", left)
	}
	e.checkNothingLeft(t, all, nil)
}

// mixedPods provisions the volumes of the hand-over tests and returns the
// pods that stay across it and those that go.
func (e *hvEnv) mixedPods(prefix string) (keep, gone []*hvPod) {
	plain, attach := e.drivers[0], e.drivers[1]
	fsKeep := e.volume(prefix+"-fs-keep", plain, false)
	fsGone := e.volume(prefix+"-fs-gone", plain, false)
	shared := e.volume(prefix+"-shared", plain, false)
	blkKeep := e.volume(prefix+"-blk-keep", plain, true)
	blkGone := e.volume(prefix+"-blk-gone", plain, true)
	attKeep := e.volume(prefix+"-att-keep", attach, false)
	attGone := e.volume(prefix+"-att-gone", attach, false)
	keep = []*hvPod{e.pod(prefix+"-keep", fsKeep, blkKeep, attKeep), e.pod(prefix+"-shared-keep", shared)}
	gone = []*hvPod{e.pod(prefix+"-gone", fsGone, blkGone, attGone), e.pod(prefix+"-shared-gone", shared)}
	return keep, gone
}

func dataOf(p *hvPod, v *hvVolume) []byte {
	return []byte(fmt.Sprintf("written by pod %s into volume %s\n", p.name, v.name))
}

// writeData writes each pod's data into each of its volumes: a file into
// a filesystem volume (pods sharing a volume each their own file), the
// first bytes of a block volume, through the pod's published path.
func (e *hvEnv) writeData(t *testing.T, pods []*hvPod) {
	t.Helper()
	for _, p := range pods {
		for _, v := range p.vols {
			target := e.target(p, v)
			if !v.block {
				if err := os.WriteFile(filepath.Join(target, p.name+".txt"), dataOf(p, v), 0o644); err != nil {
					t.Fatal(err)
				}
				continue
			}
			f, err := os.OpenFile(target, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			_, err = f.WriteAt(dataOf(p, v), 0)
			if err == nil {
				err = f.Sync()
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				t.Fatalf("writing to block volume %s of pod %s: %v", v.name, p.name, err)
			}
		}
	}
}

// checkData reads back what writeData wrote.
func (e *hvEnv) checkData(t *testing.T, pods []*hvPod) {
	t.Helper()
	for _, p := range pods {
		for _, v := range p.vols {
			target := e.target(p, v)
			want := dataOf(p, v)
			var got []byte
			var err error
			if v.block {
				var f *os.File
				if f, err = os.Open(target); err == nil {
					got = make([]byte, len(want))
					_, err = f.ReadAt(got, 0)
					f.Close()
				}
			} else {
				got, err = os.ReadFile(filepath.Join(target, p.name+".txt"))
			}
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("pod %s, volume %s: read back %q, %v; want %q", p.name, v.name, got, err, want)
			}
		}
	}
}

// without is the mount table before minus what the gone pods alone used:
// every mount whose path names a gone pod, and the staging mounts of the
// volumes no other pod uses.
func (e *hvEnv) without(before map[string]string, gone []*hvPod) map[string]string {
	used := map[*hvVolume]bool{}
	for _, p := range e.pods {
		if !slices.Contains(gone, p) {
			for _, v := range p.vols {
				used[v] = true
			}
		}
	}
	want := maps.Clone(before)
	for path := range before {
		for _, p := range gone {
			if namesPod(path, p) {
				delete(want, path)
			}
			for _, v := range p.vols {
				if !used[v] && strings.HasPrefix(path, e.staging(v)) {
					delete(want, path)
				}
			}
		}
	}
	return want
}

// unfinished lists what is left under the root (relative to it) of the
// gone pods' volumes, beyond what a finished teardown leaves: a gone pod's
// volume directories, and the staging, publish and map directories of the
// volumes no other pod uses. Both the kubelet and nodevol remove them
// last, once the driver has answered NodeUnpublishVolume or
// NodeUnstageVolume: none left means the teardown is over.
func (e *hvEnv) unfinished(t *testing.T, gone []*hvPod) []string {
	t.Helper()
	used := map[*hvVolume]bool{}
	for _, p := range e.pods {
		if !slices.Contains(gone, p) {
			for _, v := range p.vols {
				used[v] = true
			}
		}
	}
	names := map[string]bool{} // path elements that name a volume only gone pods use
	pods := map[string]bool{}  // the gone pods' UIDs
	leave := map[string]bool{} // what either side leaves of a gone pod
	for _, p := range gone {
		pods[string(p.uid())] = true
		for _, l := range e.leaves([]*hvPod{p}, true) {
			leave[l] = true
		}
		for _, v := range p.vols {
			if !used[v] {
				sum := sha256.Sum256([]byte(v.handle))
				names[v.pvName()], names[hex.EncodeToString(sum[:])] = true, true
			}
		}
	}
	var left []string
	for _, path := range volumeDirs(t, e.root) {
		if leave[path] {
			continue
		}
		for _, el := range strings.Split(path, string(filepath.Separator)) {
			if pods[el] || names[el] {
				left = append(left, path)
				break
			}
		}
	}
	return left
}

// namesPod says whether path has the pod's UID as one of its elements.
func namesPod(path string, p *hvPod) bool {
	return slices.Contains(strings.Split(path, string(filepath.Separator)), string(p.uid()))
}

// waitMounts waits until the mount table under the root is want, exactly:
// the same mount points with the same mount IDs.
func (e *hvEnv) waitMounts(t *testing.T, what string, want map[string]string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		got := mountIDs(e.root)
		if maps.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the mount table under the root is not as expected:\n%s", what, e.diffMounts(got, want))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *hvEnv) diffMounts(got, want map[string]string) string {
	var b strings.Builder
	keys := slices.Sorted(maps.Keys(maps.Collect(func(yield func(string, string) bool) {
		for k, v := range got {
			yield(k, v)
		}
		for k, v := range want {
			yield(k, v)
		}
	})))
	for _, k := range keys {
		if got[k] != want[k] {
			fmt.Fprintf(&b, "  %s: got IDs %q, want %q\n", rel(e.root, k), got[k], want[k])
		}
	}
	return b.String()
}

func rel(root, p string) string {
	if r, err := filepath.Rel(root, p); err == nil && !strings.HasPrefix(r, "..") {
		return r
	}
	return p
}

// checkNothingLeft checks, once every pod has gone, that no mount and no
// loop device is left under the root, and that the only volume
// directories left are those the side that tore the volumes down leaves
// (leaves: the kubelet tore down byKubelet's volumes, nodevol byNodevol's),
// and the extra ones. nodevol's records (under {root}/nodevol) are all
// gone when nodevol tore everything down; when the kubelet tore some
// volumes down, those of nodevol's records that name a directory that is
// gone stay (the kubelet ignores them; nodevol removes them when it starts
// again), and no other. It waits for that state: the kubelet says nothing
// when it has unstaged a volume that is not attachable (GetVolumesInUse
// forgets it with its last pod), so its teardown may still be running.
func (e *hvEnv) checkNothingLeft(t *testing.T, byKubelet, byNodevol []*hvPod, extra ...string) {
	t.Helper()
	want := append(e.leaves(byKubelet, true), extra...)
	want = append(want, e.leaves(byNodevol, false)...)
	slices.Sort(want)
	want = slices.Compact(want)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var wrong []string
		if ids := mountIDs(e.root); len(ids) > 0 {
			wrong = append(wrong, "mounts left under the root:\n"+e.diffMounts(ids, nil))
		}
		if devs := loopDevices(t, e.root); len(devs) > 0 {
			wrong = append(wrong, fmt.Sprintf("loop devices left: %v", devs))
		}
		got := volumeDirs(t, e.root)
		for _, p := range got {
			if _, found := slices.BinarySearch(want, p); !found {
				wrong = append(wrong, "left under the root: "+p)
			}
		}
		for _, p := range want {
			if _, found := slices.BinarySearch(got, p); !found {
				wrong = append(wrong, "missing under the root (the kubelet leaves it): "+p)
			}
		}
		for _, r := range e.records(t) {
			if _, err := os.Lstat(filepath.Join(e.root, r.dir)); len(byKubelet) == 0 || !os.IsNotExist(err) {
				wrong = append(wrong, fmt.Sprintf("nodevol's record %s of %s is left", rel(e.root, r.file), r.dir))
			}
		}
		if len(wrong) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(strings.Join(wrong, "\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// nvRecord is one of nodevol's records of a volume directory.
type nvRecord struct{ file, dir string }

// records lists nodevol's records under {root}/nodevol/records.
func (e *hvEnv) records(t *testing.T) []nvRecord {
	t.Helper()
	var out []nvRecord
	err := filepath.WalkDir(filepath.Join(e.root, "nodevol", "records"), func(p string, d os.DirEntry, err error) error {
		if os.IsNotExist(err) {
			return nil
		}
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		var r struct {
			Dir string `json:"dir"`
		}
		if err := json.Unmarshal(data, &r); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		out = append(out, nvRecord{file: p, dir: r.Dir})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// leaves is what is left under the root once the pods' volumes have been
// torn down: the directories of the volume plugins (kept by the kubelet
// for the next volume) and the pods' own volume directories (which the
// kubelet's housekeeping removes with the pod's directory, not its volume
// manager). The kubelet also leaves pods/{uid}/volumeDevices/kubernetes.io~csi
// of a pod with a raw block volume; nodevol removes it with the pod's last
// block volume (TestHandoverBaselineKubeletLeaves proves the kubelet's
// part).
func (e *hvEnv) leaves(pods []*hvPod, byKubelet bool) []string {
	csiDir := filepath.Join("plugins", "kubernetes.io", "csi")
	set := map[string]bool{"pods": true, filepath.Join("plugins", "kubernetes.io"): true}
	for _, p := range pods {
		dir := filepath.Join("pods", string(p.uid()))
		set[dir] = true
		for _, v := range p.vols {
			set[csiDir] = true
			if !v.block {
				set[filepath.Join(dir, "volumes")] = true
				set[filepath.Join(dir, "volumes", "kubernetes.io~csi")] = true
				set[filepath.Join(csiDir, v.driver.name)] = true
				continue
			}
			set[filepath.Join(dir, "volumeDevices")] = true
			if byKubelet {
				set[filepath.Join(dir, "volumeDevices", "kubernetes.io~csi")] = true
			}
			for _, d := range []string{"volumeDevices", "volumeDevices/publish", "volumeDevices/staging"} {
				set[filepath.Join(csiDir, d)] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// TestHandoverBaselineKubeletLeaves is the baseline of the hand-over
// tests' last check: the kubelet mounts and tears down the same pods by
// itself, and leaves what kubeletLeaves says.
func TestHandoverBaselineKubeletLeaves(t *testing.T) {
	e := newEnv(t)
	keep, gone := e.mixedPods("base")
	all := append(keep, gone...)
	k := e.startKubelet(nil)
	k.mountPods(t, all...)
	e.writeData(t, all)
	k.deletePods(t, all...)
	k.waitUnstaged(t)
	e.waitMounts(t, "the kubelet unstages every volume", map[string]string{})
	e.stopKubelet()
	e.checkNothingLeft(t, all, nil)
}
